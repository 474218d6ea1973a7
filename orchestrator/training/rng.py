"""Capture and restore every random number generator a training loop may draw from:
Python's `random`, numpy's global generator (if numpy is installed) and torch's CPU and
CUDA generators. Captured states are plain values and tensors (see `state_io`)."""

from __future__ import annotations

import random
from typing import Any

import torch


def capture_rng() -> dict[str, Any]:
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    try:
        import numpy as np  # optional dependency
    except ImportError:
        return state
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state["numpy"] = {
        "kind": str(kind),
        "keys": [int(k) for k in keys],
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np  # optional dependency

        st = state["numpy"]
        np.random.set_state(
            (
                st["kind"],
                np.asarray(st["keys"], dtype=np.uint32),
                st["pos"],
                st["has_gauss"],
                st["cached_gaussian"],
            )
        )
