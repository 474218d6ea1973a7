"""Policy names -> constructors. The one place a policy is chosen by name (CLI, config, DAG).

`make_policy("uniform-progress", safety_margin_ticks=2)` passes options to the policy's
dataclass fields; an unknown name raises `UnknownNameError`, an unknown or ill-typed option
an `InputError` naming the policy's options.
"""

from __future__ import annotations

import contextlib
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
from policies.lookahead import HeliotropeLookahead
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
        HeliotropeLookahead.name: HeliotropeLookahead,
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
    """A policy by its name, with `options` as its dataclass fields. A name may carry
    options itself, ``"heliotrope-lookahead|lookahead_samples=4|lookahead_rule=vote"``
    (values read as the field's default type); the policy then goes by that whole name."""
    spec = name
    if "|" in name:
        name, *pairs = (part.strip() for part in name.split("|"))
        options = {**_spec_options(name, spec, pairs), **options}
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
        policy = cls(**options)
    except (TypeError, ValueError) as e:
        raise InputError("", f"policy {name!r} options", "valid option values", got=str(e)) from e
    if spec != name:
        # Tables tell the variants apart; a frozen or slotted policy keeps its class's name.
        with contextlib.suppress(AttributeError, TypeError, dataclasses.FrozenInstanceError):
            policy.name = spec
    return policy


def _spec_options(name: str, spec: str, pairs: list[str]) -> dict[str, Any]:
    """``k=v`` pairs of a policy spec, each value read as the type of the field's default."""
    cls = _constructor(name)
    defaults: dict[str, Any] = (
        {f.name: f.default for f in dataclasses.fields(cls) if f.init}
        if dataclasses.is_dataclass(cls)
        else {}
    )
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = (x.strip() for x in pair.partition("="))
        if not sep or not key:
            raise InputError("", f"policy {spec!r}", "NAME|OPTION=VALUE|...", got=pair)
        default = defaults.get(key)
        value: Any = raw
        try:
            if isinstance(default, bool):
                if raw.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(raw)
                value = raw.lower() in ("true", "1")
            elif isinstance(default, int):
                value = int(raw)
            elif isinstance(default, float):
                value = float(raw)
        except ValueError:
            raise InputError(
                "", f"policy {spec!r} option {key!r}", type(default).__name__, got=raw
            ) from None
        out[key] = value
    return out


def _constructor(name: str) -> Callable[..., Policy]:
    try:
        return _CONSTRUCTORS[name]
    except KeyError:
        raise UnknownNameError("policy", name, POLICY_NAMES) from None
