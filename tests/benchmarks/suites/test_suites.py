"""Benchmark suites (orchestrator/replay/suites.py) on ../shared/data: every policy of the
registry and the oracle, tables printed.

Checked, not only printed (correctness, never speed):
- skynomad-h100, every tick billed: the oracle's mean is the exact hindsight optimum of the
  artifact's setting, 573.04 USD per job (SOURCES.md), within 0.5 %;
- skynomad-h100, finishing tick dropped (the paper's convention), over the published
  deadline and checkpoint sweeps: the oracle is never above SkyNomad's own Optimal. The
  anchors give per-setting mean, p5 and p95 over the 6 windows; if the oracle is below on
  every window, it is below on each of these order statistics, which is what is checked;
- both suites: the oracle meets every deadline and no policy that meets its deadline costs
  less than the oracle on any window.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from orchestrator.replay.suites import ORACLE, SuiteResult, run_suite
from orchestrator.replay.suites.skynomad_h100 import SKYNOMAD_OFFSET_STARTS, SKYNOMAD_OTHER_ZONES
from policies.registry import POLICY_NAMES
from tests.benchmarks.conftest import FLEET_POLICIES

pytestmark = [pytest.mark.bench, pytest.mark.traces]

POLICIES = [n for n in POLICY_NAMES if n != ORACLE]
DEADLINE_SWEEP = [1.0, 1.05, 1.1, 1.15, 1.2, 1.3, 1.5, 2.0]
CHECKPOINT_SWEEP = [0.0, 200.0, 500.0, 1000.0, 2000.0, 4000.0]


def check_oracle_is_a_lower_bound(result: SuiteResult) -> None:
    by_window: dict[tuple[str, str], dict[str, tuple[float, bool]]] = {}
    for w in result.windows:
        by_window.setdefault((w.setting, w.window), {})[w.policy] = (
            w.objective_usd,
            w.deadlines_met == w.jobs,
        )
    for key, rows in by_window.items():
        oracle, met = rows[ORACLE]
        assert met, f"oracle missed a deadline on {key}"
        for policy, (j, ok) in rows.items():
            if ok:
                assert oracle <= j + 1e-6, f"{policy} beats the oracle on {key}: {j} < {oracle}"


def test_skynomad_h100_every_tick_billed(shared_data: Path) -> None:
    result = run_suite("skynomad-h100", shared_data, POLICIES)
    print("\n" + result.format_table())
    print(f"elapsed {result.elapsed_s:.1f} s")
    mean = result.policy(ORACLE).mean_usd_per_job
    print(
        f"oracle mean {mean:.2f} USD per job; exact optimum published 573.04 "
        f"({100 * (mean / 573.04 - 1):+.3f} %); SkyNomad's DP 574.11"
    )
    assert mean == pytest.approx(573.04, rel=0.005)
    check_oracle_is_a_lower_bound(result)


@pytest.mark.parametrize("axis", ["deadline", "checkpoint"])
def test_skynomad_h100_published_sweeps(shared_data: Path, axis: str) -> None:
    overrides: dict[str, object] = {"drop_finishing_tick": True}
    if axis == "deadline":
        overrides["deadline_ratio"] = DEADLINE_SWEEP
    else:
        overrides.update(deadline_ratio=1.2, checkpoint_gb=CHECKPOINT_SWEEP)
    result = run_suite("skynomad-h100", shared_data, ["spot-failover"], overrides)
    print(
        f"\nskynomad-h100 {axis} sweep, finishing tick dropped "
        f"(oracle vs SkyNomad's Optimal; spot-failover vs their UP(S)); "
        f"{result.elapsed_s:.1f} s"
    )
    print(
        f"  {'setting':26s} {'oracle mean':>11s} {'p5':>8s} {'p95':>8s} | {'Optimal':>8s} "
        f"{'p5':>8s} {'p95':>8s} {'diff':>8s} | {'failover':>9s} {'UP(S)':>9s}"
    )
    for setting in result.settings():
        usd = np.array(
            [w.usd for w in result.windows if w.setting == setting and w.policy == ORACLE]
        )
        met = sum(
            w.deadlines_met for w in result.windows if w.setting == setting and w.policy == ORACLE
        )
        failover = result.policy("spot-failover", setting).mean_usd_per_job
        a = result.anchors.get(setting, {})
        ours = (usd.mean(), np.percentile(usd, 5), np.percentile(usd, 95))
        theirs = (
            a.get("SkyNomad Optimal mean", math.nan),
            a.get("SkyNomad Optimal p5", math.nan),
            a.get("SkyNomad Optimal p95", math.nan),
        )
        print(
            f"  {setting:26s} {ours[0]:11.2f} {ours[1]:8.2f} {ours[2]:8.2f} | "
            f"{theirs[0]:8.2f} {theirs[1]:8.2f} {theirs[2]:8.2f} {ours[0] - theirs[0]:+8.2f} | "
            f"{failover:9.2f} {a.get('UP(S) mean', math.nan):9.2f}"
            f"{'' if met == len(usd) else f'  (deadline unreachable: {met}/{len(usd)} met)'}"
        )
        assert not math.isnan(theirs[0]), f"no published anchor for {setting}"
        if met == len(usd):
            for o, t in zip(ours, theirs, strict=True):
                assert o <= t + 0.01
            # spot-failover is SkyNomad's UP(S) (docs/policies.md says where the two rules
            # can part; on the published settings they do not).
            assert failover == pytest.approx(a["UP(S) mean"], abs=0.01)


def test_cbl_v100(shared_data: Path) -> None:
    # heliotrope-lookahead here is some 40 min of CPU (195 s ticks: ~1,000-tick DPs at every
    # relaunch); docs/policies.md has its figures.
    result = run_suite("cbl-v100", shared_data, list(FLEET_POLICIES))
    print("\n" + result.format_table())
    print(f"elapsed {result.elapsed_s:.1f} s")
    check_oracle_is_a_lower_bound(result)


@pytest.mark.timeout(3600)  # three prices of 200 jobs: 23 min on 2 cores (measured)
def test_carbon_year(shared_data: Path) -> None:
    """The 200 jobs at 0, 50 and 200 USD/t (7-8 min a price on 2 workers), with issue 14's
    targets printed per price: J / J(oracle) (<= 1.05), every deadline met, and at 200 USD/t
    heliotrope's kgCO2 per job against spot-failover's (at least 50 % below). Several jobs
    per window: the oracle is each job's optimum given the capacity the jobs before it
    booked, not a bound, so only what must hold is checked: every policy is accounted on the
    same windows, heliotrope meets every deadline, and its carbon per job is below
    spot-failover's (the carbon price is what it trades dollars for)."""
    import os

    policies = ["heliotrope", "spot-failover", "carbon-greedy", "uniform-progress"]
    result = run_suite(
        "carbon-year",
        shared_data,
        policies,
        {"carbon_prices": [0.0, 50.0, 200.0]},
        workers=min(2, os.cpu_count() or 1),
    )
    print("\n" + result.format_table())
    print(f"elapsed {result.elapsed_s:.1f} s")
    print("carbon-year, heliotrope against issue 14's targets (J = USD + price x tCO2):")
    for setting in result.settings():
        heliotrope = result.policy("heliotrope", setting)
        failover = result.policy("spot-failover", setting)
        assert heliotrope.jobs == failover.jobs == 200
        assert heliotrope.deadlines_met == 200
        assert heliotrope.mean_kg_co2_per_job < failover.mean_kg_co2_per_job
        assert heliotrope.regret is not None and math.isfinite(heliotrope.regret)
        cut = 1 - heliotrope.mean_kg_co2_per_job / failover.mean_kg_co2_per_job
        print(
            f"  {setting:24s} J ratio {1 + heliotrope.regret:.4f} (target <= 1.05), "
            f"non-trivial {heliotrope.nontrivial_mean_ratio or 1.0:.4f}, "
            f"worst {heliotrope.worst_ratio or 1.0:.4f}, deadlines "
            f"{heliotrope.deadlines_met}/{heliotrope.jobs}, kgCO2 {cut:.1%} below "
            f"spot-failover (target at 200 USD/t: >= 50 %)"
        )


# Issue 14's sweeps: heliotrope's ratio to the oracle at every point, every tick billed.
ISSUE14_SWEEPS = {
    "deadline": {"deadline_ratio": [1.1, 1.2, 1.3, 1.5, 2.0, 3.0]},
    "checkpoint": {"deadline_ratio": 1.2, "checkpoint_gb": [0.0, 50.0, 500.0, 2000.0, 4000.0]},
}


# Where the sweeps run: the suite's 6 windows and zones, which heliotrope's defaults were
# tuned on; 36 other starts in the same zones; the 6 windows in the artifact's 7 other zones.
WINDOWS: dict[str, dict[str, object]] = {
    "tuned": {},
    "offset": {"start_ticks": list(SKYNOMAD_OFFSET_STARTS)},
    "other-zones": {"zones": list(SKYNOMAD_OTHER_ZONES)},
}


@pytest.mark.parametrize("windows", list(WINDOWS))
@pytest.mark.parametrize("axis", list(ISSUE14_SWEEPS))
def test_heliotrope_on_the_skynomad_sweeps(shared_data: Path, axis: str, windows: str) -> None:
    """Printed per point: J / J(oracle) over the windows, the mean over the non-trivial
    windows and the worst window (targets, on the tuned windows: <= 1.03, <= 1.05 and every
    deadline met; docs/policies.md has the measured tables). The offset windows and the
    other zones say whether the figures hold where the defaults were not tuned; in the
    other zones heliotrope-lookahead runs too (3-4 min a sweep there; on the 36 offset
    windows its checkpoint sweep alone took 25 min). Checked: the oracle bounds every
    window."""
    policies = ["heliotrope", "spot-failover"]
    if windows == "other-zones":
        policies.append("heliotrope-lookahead")
    result = run_suite(
        "skynomad-h100", shared_data, policies, {**ISSUE14_SWEEPS[axis], **WINDOWS[windows]}
    )
    print(f"\nskynomad-h100 {axis} sweep, {windows} ({result.elapsed_s:.1f} s): J / J(oracle)")
    print(
        f"  {'setting':26s} {'policy':20s} {'ratio':>7s} {'non-triv':>9s} {'worst':>7s} {'met':>5s}"
    )
    for setting in result.settings():
        for policy in policies:
            r = result.policy(policy, setting)
            assert r.regret is not None and r.worst_ratio is not None
            print(
                f"  {setting:26s} {policy:20s} {1 + r.regret:7.4f} "
                f"{r.nontrivial_mean_ratio or 1.0:9.4f} {r.worst_ratio:7.4f} "
                f"{r.deadlines_met}/{r.jobs}"
            )
    check_oracle_is_a_lower_bound(result)
