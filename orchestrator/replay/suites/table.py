"""The plain-text tables of a suite result (`heliotrope bench policies`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from orchestrator.replay.suites.base import ORACLE

if TYPE_CHECKING:
    from orchestrator.replay.suites.results import PolicySummary, SuiteResult


def format_table(result: SuiteResult) -> str:
    """Plain-text tables: per setting and policy, then per window. A regret marked `*`
    belongs to a policy (the oracle included) that missed deadlines: not comparable.
    `non-triv` is the mean J / J(oracle) over the windows where the oracle's plan is not
    one uninterrupted stay per job (how many: `n`), `worst` the largest window's."""
    lines = [f"suite {result.suite}: {result.description}"]
    head = (
        f"{'setting':28s} {'policy':22s} {'USD/job':>10s} {'kgCO2/job':>10s} "
        f"{'met':>7s} {'regret':>8s} {'non-triv':>9s} {'n':>3s} {'worst':>7s} "
        f"{'(window)':10s}"
    )

    def row(setting: str, r: PolicySummary) -> str:
        missed = r.deadlines_met < r.jobs
        return (
            f"{setting:28s} {r.policy:22s} {r.mean_usd_per_job:10.2f} "
            f"{r.mean_kg_co2_per_job:10.2f} {f'{r.deadlines_met}/{r.jobs}':>7s} "
            f"{_pct(r.regret, missed):>8s} {_x(r.nontrivial_mean_ratio):>9s} "
            f"{r.nontrivial_windows:3d} {_x(r.worst_ratio):>7s} {r.worst_window:10s}"
        ).rstrip()

    lines += ["", head, "-" * len(head)]
    for r in result.by_setting:
        lines.append(row(r.setting, r))
        for label, value in result.anchors.get(r.setting, {}).items():
            if r.policy == ORACLE and label.startswith("SkyNomad Optimal"):
                lines.append(f"{'':28s} {'  anchor: ' + label:22s} {value:10.2f}")
    if len(result.settings()) > 1:
        lines += ["", head, "-" * len(head)]
        lines += [row("all", r) for r in result.summary]
    head = (
        f"{'setting':28s} {'window':10s} {'policy':22s} {'USD':>10s} {'kgCO2':>9s} "
        f"{'met':>5s} {'regret':>8s}"
    )
    lines += ["", head, "-" * len(head)]
    for w in result.windows:
        lines.append(
            f"{w.setting:28s} {w.window:10s} {w.policy:22s} {w.usd:10.2f} "
            f"{w.kg_co2:9.2f} {f'{w.deadlines_met}/{w.jobs}':>5s} "
            f"{_pct(w.regret, w.deadlines_met < w.jobs):>8s}"
            + ("  (trivial)" if w.trivial and w.policy == ORACLE else "")
        )
    if any(w.deadlines_met < w.jobs for w in result.windows):
        lines += ["", "* missed deadlines: regret not comparable"]
    extra = [(s, label, v) for s, a in result.anchors.items() for label, v in a.items()]
    if extra:
        lines += ["", "published numbers (USD per job):"]
        lines += [f"  {s:26s} {label:40s} {v:10.2f}" for s, label, v in extra]
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}x"


def _pct(value: float | None, missed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{100 * value:+.2f}%" + ("*" if missed else "")
