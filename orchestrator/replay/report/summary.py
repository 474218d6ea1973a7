"""The replay in words: one paragraph on how the focus policy did against the others."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from orchestrator.replay.report.table import (
    REFERENCE_POLICIES,
    as_float,
    beaten_by,
    missed_deadlines,
    objective_of,
    policy_metrics,
    ranked_policies,
)


def _pct(value: float, baseline: float) -> float:
    return 100.0 * (baseline - value) / baseline if baseline else 0.0


def _compare(
    name: str, ours: Mapping[str, Any], other: str, theirs: Mapping[str, Any], note: str = ""
) -> str | None:
    """``18% cheaper than spot-failover, 53% less CO₂`` (or dearer / more), from totals."""
    usd, kg = as_float(ours.get("usd")), as_float(ours.get("kg_co2"))
    base_usd, base_kg = as_float(theirs.get("usd")), as_float(theirs.get("kg_co2"))
    if usd is None or base_usd is None or base_usd <= 0:
        return None
    d = _pct(usd, base_usd)
    text = (
        f"{abs(d):.0f}% {'cheaper' if d >= 0 else 'dearer'} than {other}"
        if round(d)
        else f"as cheap as {other}"
    ) + note
    if kg is not None and base_kg is not None and base_kg > 0:
        c = _pct(kg, base_kg)
        text += (
            f", {abs(c):.0f}% {'less' if c >= 0 else 'more'} CO₂" if round(c) else ", the same CO₂"
        )
    return text


def summary(results: Mapping[str, Any], focus: str = "heliotrope") -> str:
    """One paragraph in words: how `focus` (else the cheapest policy that met every
    deadline) did against the cheapest other policy that met every deadline and against
    on-demand, its deadlines, who missed deadlines, and whether the oracle is a bound."""
    policies = policy_metrics(results)
    if not policies:
        return ""
    missed = missed_deadlines(policies)
    contenders = [n for n in ranked_policies(results) if n not in REFERENCE_POLICIES]
    by_cost = sorted(contenders, key=lambda n: as_float(policies[n].get("usd")) or math.inf)
    if focus not in policies or focus in REFERENCE_POLICIES:
        focus = by_cost[0] if by_cost else next(iter(policies))
    ours = policies[focus]
    others = [n for n in by_cost if n != focus]
    parts = []
    if others:
        versus = _compare(
            focus,
            ours,
            others[0],
            policies[others[0]],
            " (the cheapest other policy that met every deadline)" if len(others) > 1 else "",
        )
        if versus:
            parts.append(versus)
    if "on-demand" in policies and "on-demand" not in (focus, *others[:1]):
        versus = _compare(focus, ours, "on-demand", policies["on-demand"])
        if versus:
            parts.append(versus)
    deadlines = _deadline_words(ours, missed.get(focus, 0))
    text = f"{focus}: " + ("; ".join(parts) + "; " if parts else "") + deadlines + "."
    if focus in missed:
        text += " Its cost is not comparable with policies that met every deadline."
    losers = [n for n in policies if n in missed and n != focus]
    if losers:
        text += (
            " "
            + ", ".join(f"{n} missed {missed[n]}" for n in losers)
            + " deadline(s): marked in the table and the plot and never ranked best."
        )
    for ref in (n for n in policies if n in REFERENCE_POLICIES and n != focus):
        text += _reference_words(results, ref, focus, missed)
    return text


def _deadline_words(ours: Mapping[str, Any], missed: int) -> str:
    met = int(as_float(ours.get("deadlines_met")) or 0)
    infeasible = int(as_float(ours.get("infeasible")) or 0)
    if missed:
        words = f"it missed {missed} of {met + missed} deadlines"
    else:
        words = f"all {met} deadline{'s' if met != 1 else ''} met"
    if infeasible:
        words += (
            f" ({infeasible} job{'s' if infeasible != 1 else ''} no policy could "
            "finish in time left out)"
        )
    return words


def _reference_words(
    results: Mapping[str, Any], ref: str, focus: str, missed: Mapping[str, int]
) -> str:
    """Whether the reference `ref` (the oracle) is a bound here, and how far below."""
    policies = policy_metrics(results)
    beaten = beaten_by(results, ref)
    if beaten:
        return (
            f" The {ref} (hindsight) is shown for reference but is not a bound here: "
            f"{', '.join(beaten)} met every deadline at a lower objective."
        )
    if ref in missed or objective_of(policies[ref]) is None:
        return ""
    gap = objective_of(policies[focus])
    bound = objective_of(policies[ref])
    if gap is None or not bound:
        return ""
    return (
        f" The {ref} (hindsight, a bound on the objective): "
        f"{abs(_pct(bound, gap)):.0f}% below {focus}'s objective."
    )
