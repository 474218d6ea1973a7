"""Policy names -> constructors. The one place a policy is chosen by name (CLI, config, DAG).

`make_policy("uniform-progress", safety_margin_ticks=2)` passes options to the policy's
dataclass fields; an unknown name raises `UnknownNameError`, an unknown or ill-typed option
an `InputError` naming the policy's options.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

from orchestrator.errors import InputError, UnknownNameError
from policies.base import Policy
from policies.baselines import (
    CarbonGreedy,
    CurtailmentThreshold,
    OnDemand,
    SpotFailover,
    UniformProgress,
)
from policies.heliotrope import Heliotrope
from policies.oracle import Oracle

_CONSTRUCTORS: Final[Mapping[str, Callable[..., Policy]]] = MappingProxyType(
    {
        # Baselines (DESIGN.md §5).
        OnDemand.name: OnDemand,
        SpotFailover.name: SpotFailover,
        UniformProgress.name: UniformProgress,
        CarbonGreedy.name: CarbonGreedy,
        CurtailmentThreshold.name: CurtailmentThreshold,
        # Ours.
        Heliotrope.name: Heliotrope,
        # The hindsight bound (a replay binds the realized grid: `Oracle.with_hindsight`).
        Oracle.name: Oracle,
    }
)

POLICY_NAMES: Final[tuple[str, ...]] = tuple(_CONSTRUCTORS)


def policy_options(name: str) -> tuple[str, ...]:
    """The option names `make_policy(name, ...)` accepts."""
    cls = _constructor(name)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return ()


def make_policy(name: str, /, **options: Any) -> Policy:
    """A policy by its name, with `options` as its dataclass fields."""
    cls = _constructor(name)
    known = policy_options(name)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InputError(
            "",
            f"policy {name!r} options",
            "one of: " + (", ".join(known) or "(none)"),
            got=", ".join(unknown),
            fix="drop or rename the option",
        )
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise InputError("", f"policy {name!r} options", "valid option values", got=str(e)) from e


def _constructor(name: str) -> Callable[..., Policy]:
    try:
        return _CONSTRUCTORS[name]
    except KeyError:
        raise UnknownNameError("policy", name, POLICY_NAMES) from None
