"""Checkpoint speed (issue #4): the store against raw file I/O, async against sync.

1. Throughput: a 1 GiB state dict written and read back through the checkpoint store
   (file://, sha256 of every byte, manifest, atomic publish, verified read) against the
   same serialized bytes written and read with plain `open()` in the same run.
   Target: store / raw >= 0.8.
2. Training-loop stall per checkpoint: how long `step_done` blocks the loop when it
   checkpoints, async (copy to host buffers, write in the background) against sync.
   Target: async / sync <= 0.1. Also printed: the wall-clock cost per checkpoint (the loop
   slowed by background work sharing the same CPUs).

Prints; asserts only that the runs worked (timings on a shared machine are not asserted).
"""

from __future__ import annotations

import gc
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator.checkpoints import CheckpointStore, WriteFn
from orchestrator.training import ResumableRun, load_state, save_state, state_digest

pytestmark = pytest.mark.bench

GIB = 1 << 30


def big_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    # 16 x 64 MiB fp32 tensors, like a 268M-parameter model's weights
    return {f"layers.{i}.weight": torch.rand(4096, 4096, generator=gen) for i in range(16)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def test_store_throughput_against_raw_files(tmp_path: Path) -> None:
    state = big_state()
    size = sum(t.numel() * t.element_size() for t in state.values())
    assert size == GIB
    store = CheckpointStore(f"file://{tmp_path}/store")
    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    want = state_digest(state)
    rounds: list[dict[str, float]] = []
    for rnd in range(2):
        raw_path = raw_dir / f"state-{rnd}"

        def raw_write(path: Path = raw_path) -> int:
            with open(path, "wb") as f:
                return save_state(state, f)

        def raw_read(path: Path = raw_path) -> Any:
            with open(path, "rb") as f:
                return load_state(f)

        def store_write(step: int = rnd + 1) -> Any:
            def files(open_file: WriteFn) -> None:
                with open_file("state") as f:
                    save_state(state, f)

            return store.write("bench", step, files, now_s=0.0)

        t_raw_w, nbytes = timed(raw_write)
        t_store_w, ref = timed(store_write)

        def store_read() -> Any:
            with store.open_file(ref, "state") as f:  # verified: size and sha256
                return load_state(f)

        t_raw_r, back_raw = timed(raw_read)
        t_store_r, back_store = timed(store_read)
        assert state_digest(back_store) == want == state_digest(back_raw)
        del back_raw, back_store
        rounds.append({"raw_w": t_raw_w, "store_w": t_store_w, "raw_r": t_raw_r,
                       "store_r": t_store_r, "bytes": float(nbytes)})
        raw_path.unlink()
        shutil.rmtree(tmp_path / "store" / "bench")

    best = {k: min(r[k] for r in rounds) for k in rounds[0]}
    gb = best["bytes"] / 1e9
    ratio_w = best["raw_w"] / best["store_w"]
    ratio_r = best["raw_r"] / best["store_r"]
    ratio = (best["raw_w"] + best["raw_r"]) / (best["store_w"] + best["store_r"])
    print(f"\ncheckpoint throughput, {gb:.2f} GB state dict (best of {len(rounds)}):")
    print(f"  write: raw {gb / best['raw_w']:.2f} GB/s, store {gb / best['store_w']:.2f} GB/s"
          f" -> ratio {ratio_w:.2f}")
    print(f"  read:  raw {gb / best['raw_r']:.2f} GB/s, store (verified) "
          f"{gb / best['store_r']:.2f} GB/s -> ratio {ratio_r:.2f}")
    print(f"  write+read ratio store/raw: {ratio:.2f} (target >= 0.8)")

    # context: the usual torch.save / torch.load to a file
    path = raw_dir / "torch.pt"
    t_save, _ = timed(lambda: torch.save(state, path))
    t_load, _ = timed(lambda: torch.load(path, weights_only=True))
    print(f"  (torch.save {gb / t_save:.2f} GB/s, torch.load {gb / t_load:.2f} GB/s, raw file)")


class Wide(torch.nn.Module):
    """~50M parameters in wide linear layers: ~0.6 GB of model + AdamW state."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[
            torch.nn.Sequential(torch.nn.Linear(3584, 3584), torch.nn.ReLU())
            for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(self.layers(x))


def loop(store: CheckpointStore, job: str, *, async_checkpoint: bool, every: int,
         steps: int) -> tuple[ResumableRun, float]:
    torch.manual_seed(0)
    model = Wide()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = ResumableRun(model, opt, job_id=job, store=store, every_steps=every,
                       async_checkpoint=async_checkpoint, notice_sources=[],
                       handle_signals=False)
    x = torch.randn(8, 3584)
    start = run.restore()
    t0 = time.perf_counter()
    for step in range(start, steps):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.step_done(step, {"step": step})
    elapsed = time.perf_counter() - t0
    run.finish()
    return run, elapsed


def test_loop_stall_async_against_sync(tmp_path: Path) -> None:
    store = CheckpointStore(f"file://{tmp_path}/store")
    steps, every = 17, 4  # checkpoints after steps 4, 8, 12, 16
    _, t_none = loop(store, "none", async_checkpoint=False, every=10_000, steps=steps)
    sync_run, t_sync = loop(store, "sync", async_checkpoint=False, every=every, steps=steps)
    async_run, t_async = loop(store, "async", async_checkpoint=True, every=every, steps=steps)
    assert len(sync_run.stall_s) == len(async_run.stall_s) == 4
    size_gb = sync_run.checkpoints[0].size_bytes / 1e9
    sync_stall = sum(sync_run.stall_s) / 4
    async_stall = sum(async_run.stall_s) / 4
    async_steady = sum(async_run.stall_s[1:]) / 3  # buffers allocated at the first one
    n = 4
    print(f"\ntraining-loop stall per checkpoint, {size_gb:.2f} GB of state "
          f"(model + AdamW), {n} checkpoints:")
    print(f"  sync:  {sync_stall:.3f} s   (each: "
          + ", ".join(f"{s:.2f}" for s in sync_run.stall_s) + ")")
    print(f"  async: {async_stall:.3f} s   (each: "
          + ", ".join(f"{s:.2f}" for s in async_run.stall_s) + ")")
    print(f"  ratio async/sync: {async_stall / sync_stall:.3f} "
          f"(after the first, buffers reused: {async_steady / sync_stall:.3f}; target <= 0.1)")
    print(f"  loop wall time for {steps} steps: none {t_none:.1f} s, sync {t_sync:.1f} s, "
          f"async {t_async:.1f} s -> per checkpoint: sync {(t_sync - t_none) / n:.2f} s, "
          f"async {(t_async - t_none) / n:.2f} s (background writes share the CPUs)")
    # both wrote the same states
    sync_last = sync_run.checkpoints[-1]
    async_last = async_run.checkpoints[-1]
    with store.open_file(sync_last, "state") as f:
        a = load_state(f)
    with store.open_file(async_last, "state") as f:
        b = load_state(f)
    assert state_digest(a["model"]) == state_digest(b["model"])
