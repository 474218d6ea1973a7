"""The hindsight oracle (policies/oracle.py).

1. The DP against exhaustive search over every action sequence on tiny problems (3-6 ticks,
   2-3 offers), with an independent simulator written from the loop's rules.
2. Through the real loop: the replayed cost of the oracle's plan equals its DP value; it
   is never worse than a baseline that meets its deadline; contention and infeasible
   deadlines.
3. The skynomad-h100 suite's setup for one window (needs ../shared/data).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from orchestrator import catalog
from orchestrator.loop import LoopOptions
from orchestrator.model import (
    CostSettings,
    Decision,
    EventKind,
    JobSpec,
    Market,
    Phase,
)
from orchestrator.replay.runner import build_grid, run_policy
from orchestrator.signals.grid import SignalGrid
from policies.base import Policy, Snapshot
from policies.baselines import CarbonGreedy, OnDemand, SpotFailover, UniformProgress
from policies.oracle import NO_OFFER, Hindsight, JobProblem, Oracle, plan_job
from policies.registry import make_policy
from tests.conftest import T0, tiny_trace

TICK_S = 600.0

# --- 1. exhaustive search -------------------------------------------------------------------


def simulate(pb: JobProblem, seq: tuple[int, ...]) -> float:
    """J of holding seq[i] during tick i (-1: nothing), by the loop's rules; inf when a
    launch would be refused, an unusable offer held, the deadline missed, or an instance
    given up (or lost) before its cold start is over: the oracle never does that (the loop
    counts the checkpoint as moved at launch, so such a launch would move it for less than
    a launch costs; see the oracle's docstring)."""
    held, ready, progress = pb.start_offer, -math.inf, 0.0
    ckpt = pb.start_location if pb.start_location >= 0 else pb.n_locations
    if held >= 0:
        ckpt = int(pb.location[held])
    usd = kg = 0.0
    for i, a in enumerate(seq):
        t0 = i * pb.tick_s
        starting = held >= 0 and ready > t0 + 1e-9
        if held >= 0 and pb.preempted[i, held]:  # the provider takes it at the boundary
            if starting:
                return math.inf
            held = NO_OFFER
        if starting and a != held:
            return math.inf
        if a != held:
            held = a
            if a >= 0:
                if not pb.usable[i, a]:
                    return math.inf  # the planner refuses the launch
                usd += pb.egress_usd[ckpt, pb.location[a]]
                ready = t0 + pb.startup_h[ckpt, pb.location[a]] * 3600.0
                ckpt = int(pb.location[a])
        if held < 0:
            continue
        if not pb.usable[i, held]:
            return math.inf
        t1 = t0 + pb.tick_s
        run_from = min(max(ready, t0), t1)
        need = (pb.work_gpu_h - progress) / pb.rate[held] * 3600.0
        done = need <= (t1 - run_from) + 1e-9
        billed_s = pb.tick_s if (not done or pb.bill_final_tick) else run_from - t0 + need
        tick_usd = pb.usd_per_hour[i, held] * billed_s / 3600.0
        tick_kg = pb.kg_per_hour[i, held] * billed_s / 3600.0
        if done:
            if run_from + need > pb.deadline_s + 1e-6:
                return math.inf
            if pb.finishing_tick_free:
                tick_usd = tick_kg = 0.0
            return float(usd + tick_usd + pb.carbon_usd_per_tonne * (kg + tick_kg) / 1000.0)
        usd += tick_usd
        kg += tick_kg
        progress += pb.rate[held] * (t1 - run_from) / 3600.0
    return math.inf


def exhaustive(pb: JobProblem) -> float:
    n_offers = pb.usable.shape[1]
    return min(
        simulate(pb, seq) for seq in itertools.product(range(-1, n_offers), repeat=pb.dp_ticks)
    )


def random_problem(rng: np.random.Generator) -> JobProblem:
    n_ticks = int(rng.integers(3, 7))
    n_offers = int(rng.integers(2, 4))
    n_loc = int(rng.integers(1, 3))
    rate = rng.choice([0.5, 1.0, 2.0], n_offers)
    spot = rng.random(n_offers) < 0.6
    available = rng.random((n_ticks, n_offers)) < 0.7
    short = spot[None, :] & ~available
    price = np.round(rng.uniform(0.5, 6.0, (n_ticks, n_offers)), 2)
    price[:, spot] = np.round(price[:, spot] / 3, 2)
    kg = np.round(rng.uniform(0.0, 2.0, (n_ticks, n_offers)), 3)
    location = rng.integers(0, n_loc, n_offers)
    egress = np.round(rng.uniform(0.0, 3.0, (n_loc + 1, n_loc)), 2)
    egress[np.arange(n_loc), np.arange(n_loc)] = 0.0
    egress[n_loc] = 0.0
    cold_h = float(rng.choice([0.0, 0.05, 0.1, 1 / 6, 0.2, 0.25]))
    transfer_h = float(rng.choice([0.0, 0.025, 0.1]))
    startup = np.full((n_loc + 1, n_loc), cold_h)
    startup[:n_loc] += transfer_h
    startup[np.arange(n_loc), np.arange(n_loc)] = cold_h
    tick_h = TICK_S / 3600.0
    work = float(rng.uniform(0.05, 1.0) * rate.max() * tick_h * n_ticks)
    deadline = float(rng.uniform(n_ticks - 1, n_ticks)) * TICK_S
    start_offer = NO_OFFER
    start_location = int(rng.integers(-1, n_loc))
    if rng.random() < 0.3 and available[0].any():
        start_offer = int(np.flatnonzero(available[0] | ~spot)[0])
        start_location = -1
    return JobProblem(
        tick_s=TICK_S,
        deadline_s=deadline,
        work_gpu_h=work,
        rate=rate,
        usd_per_hour=price,
        kg_per_hour=kg,
        usable=~short,
        preempted=short,
        location=location,
        egress_usd=egress,
        startup_h=startup,
        carbon_usd_per_tonne=float(rng.choice([0.0, 150.0])),
        bill_final_tick=bool(rng.random() < 0.5),
        finishing_tick_free=bool(rng.random() < 0.2),
        start_offer=start_offer,
        start_location=start_location,
    )


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_exhaustive_search(seed: int) -> None:
    pb = random_problem(np.random.default_rng(seed))
    best = exhaustive(pb)
    plan = plan_job(pb)
    if math.isinf(best):
        assert plan.fallback and not plan.meets_deadline
        return
    assert plan.exact and not plan.fallback and plan.meets_deadline
    assert plan.dp_objective_usd == pytest.approx(best, rel=1e-9, abs=1e-9)
    # Its own schedule, billed by the independent simulator, costs what the DP says.
    assert plan.objective_usd == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert simulate(pb, tuple(int(t) for t in plan.target)) == pytest.approx(
        best, rel=1e-9, abs=1e-9
    )


def test_dp_hand_worked_case() -> None:
    """Two offers in two regions; spot (1 $/h) gone in tick 2, on-demand 4 $/h elsewhere.
    Work 2 ticks, cold start 0.6 tick, deadline 4 ticks: spot for ticks 0-1 (progress 1.4
    ticks), then move (egress 0.1) and run 0.4 + 0.2 ticks on-demand, finishing at 3.2
    ticks: 2/6 + 0.1 + 1.2 * 4/6 = 1.2333 USD, against 2.6 * 4/6 = 1.7333 on-demand only."""
    tick_h = TICK_S / 3600.0
    short = np.array([[False, False], [False, False], [True, False], [False, False]])
    pb = JobProblem(
        tick_s=TICK_S,
        deadline_s=4 * TICK_S,
        work_gpu_h=2 * tick_h,
        rate=np.ones(2),
        usd_per_hour=np.array([[1.0, 4.0]] * 4),
        kg_per_hour=np.zeros((4, 2)),
        usable=~short,
        preempted=short,
        location=np.array([0, 1]),
        egress_usd=np.array([[0.0, 0.1], [0.1, 0.0], [0.0, 0.0]]),
        startup_h=np.full((3, 2), 0.6 * tick_h),
    )
    plan = plan_job(pb)
    assert plan.target.tolist() == [0, 0, 1, 1]
    assert plan.held.tolist() == [NO_OFFER, 0, NO_OFFER, 1]
    expected = 2 * tick_h * 1.0 + 0.1 + (1 + 0.2) * tick_h * 4.0
    assert exhaustive(pb) == pytest.approx(expected)
    assert plan.dp_objective_usd == pytest.approx(expected)
    assert plan.objective_usd == pytest.approx(expected)
    assert plan.finish_s == pytest.approx(3.2 * TICK_S)


@pytest.mark.parametrize("limits", [{"max_levels": 16}, {"max_cells": 2_000}])
def test_coarse_grid_is_conservative(limits: dict[str, int]) -> None:
    """Past the level or work budget the grid is coarsened: increments round down, so the
    plan still meets the deadline (or falls back) and never claims less than the optimum."""
    coarsened = 0
    for seed in range(40):
        pb = random_problem(np.random.default_rng(seed))
        exact = plan_job(pb)
        coarse = plan_job(pb, **limits)
        if exact.fallback:
            continue
        coarsened += not coarse.exact
        assert coarse.meets_deadline or coarse.fallback
        if not coarse.fallback:
            assert coarse.objective_usd >= exact.objective_usd - 1e-9
            assert coarse.dp_objective_usd >= coarse.objective_usd - 1e-9
    assert coarsened > 0


# --- 2. through the loop --------------------------------------------------------------------


def job(work: float = 4.0, hours: float = 14.0, **kw: object) -> JobSpec:
    args: dict[str, object] = {
        "id": "a",
        "work_gpu_hours": work,
        "gpus": 1,
        "start": T0,
        "deadline": T0 + timedelta(hours=hours),
        "checkpoint_size_gb": 10.0,
        "cold_start_h": 0.1,
        "home_region": "us-east-1",
        "checkpoint_interval_h": 0.0,
    }
    args.update(kw)
    return JobSpec(**args)  # type: ignore[arg-type]


def objective(fleet_usd: float, fleet_kg: float, settings: CostSettings) -> float:
    return fleet_usd + settings.carbon_usd_per_tonne * fleet_kg / 1000.0


SCENARIOS = [
    # (spot pattern of the AWS spot offer, job options, settings)
    (((0.0, 1.0), (3.0, 0.0), (6.0, 1.0), (9.0, 0.0)), {}, CostSettings()),
    (
        ((0.0, 0.0), (1.0, 1.0), (2.5, 0.0), (4.0, 1.0)),
        {"work": 1.5, "hours": 6.0},
        CostSettings(bill_final_tick=True),
    ),
    (
        ((0.0, 1.0), (0.5, 0.0), (2.0, 1.0)),
        {"work": 2.0, "hours": 8.0, "cold_start_h": 0.25, "checkpoint_size_gb": 200.0},
        CostSettings(carbon_usd_per_tonne=300.0),
    ),
    (
        ((0.0, 1.0), (2.0, 0.0)),
        {"work": 3.0, "hours": 9.0, "gpu_types": frozenset({"V100"})},
        CostSettings(bill_final_tick=True),
    ),
    (
        ((0.0, 1.0), (1.0, 0.0), (1.5, 1.0)),
        {"work": 3.0, "hours": 5.0},
        CostSettings(egress_usd_per_gb=0.5, transfer_time=False),
    ),
]


@pytest.mark.parametrize("pattern,options,settings", SCENARIOS)
def test_replayed_cost_equals_dp_value(
    pattern: tuple[tuple[float, float], ...], options: dict[str, object], settings: CostSettings
) -> None:
    trace = tiny_trace(spot_pattern=pattern, carbon={"US-MIDA-PJM": 450.0, "NL": 150.0})
    spec = job(**options)  # type: ignore[arg-type]
    grid = build_grid(trace, [spec], 600, 0)
    oracle = Oracle(Hindsight.of(grid))
    run = run_policy(oracle, [spec], grid, options=LoopOptions(settings=settings))
    plan = oracle.plans[spec.id]
    assert plan.exact and not plan.fallback and plan.meets_deadline
    f = run.fleet
    assert f.phase[0] == Phase.DONE
    assert f.finished_at_s[0] <= spec.deadline.timestamp() + 1e-6
    assert f.finished_at_s[0] == pytest.approx(plan.finish_s)
    replayed = objective(float(f.usd[0]), float(f.kg_co2[0]), settings)
    assert replayed == pytest.approx(plan.dp_objective_usd, rel=1e-9)
    assert float(f.usd[0]) == pytest.approx(plan.usd, rel=1e-9)
    # The plan was followed: one plan, never re-planned.
    assert plan.first_tick == 0


def test_never_worse_than_a_baseline_on_random_instances() -> None:
    rng = np.random.default_rng(11)
    baselines: list[Policy] = [OnDemand(), SpotFailover(), UniformProgress(), CarbonGreedy()]
    for _ in range(8):
        changes = np.cumsum(rng.uniform(0.3, 3.0, 8))
        pattern = (
            (0.0, float(rng.integers(0, 2))),
            *((float(h), float(rng.integers(0, 2))) for h in changes),
        )
        trace = tiny_trace(spot_pattern=pattern, hours=30.0)
        settings = CostSettings(
            bill_final_tick=bool(rng.integers(0, 2)),
            carbon_usd_per_tonne=float(rng.choice([0.0, 200.0])),
        )
        spec = job(
            work=float(rng.uniform(1.0, 5.0)),
            hours=float(rng.uniform(8.0, 20.0)),
            cold_start_h=float(rng.choice([0.05, 0.1, 0.2])),
            gpu_types=frozenset({"V100", "A100-80GB"}),
        )
        grid = build_grid(trace, [spec], 600, 0)
        options = LoopOptions(settings=settings)
        oracle = run_policy(Oracle(Hindsight.of(grid)), [spec], grid, options=options)
        assert oracle.fleet.finished_at_s[0] <= spec.deadline.timestamp() + 1e-6
        best = objective(float(oracle.fleet.usd[0]), float(oracle.fleet.kg_co2[0]), settings)
        for policy in baselines:
            run = run_policy(policy, [spec], grid, options=options)
            f = run.fleet
            if f.phase[0] != Phase.DONE or f.finished_at_s[0] > spec.deadline.timestamp() + 1e-6:
                continue
            assert best <= objective(float(f.usd[0]), float(f.kg_co2[0]), settings) + 1e-9, (
                policy.name
            )


def test_jobs_share_one_spot_slot_through_the_ledger() -> None:
    """Two jobs, one AWS spot slot: the first plan books it, the second is planned on what is
    left, so no launch is refused, nobody re-plans, both meet their deadlines and the slot
    is never planned twice in one tick (the tick after a stay included: the loop frees an
    instance only after that boundary's launches)."""
    trace = tiny_trace(spot_pattern=((0.0, 1.0),))
    jobs = [job(id=name, work=2.0, hours=6.0, gpu_types=frozenset({"V100"})) for name in ("a", "b")]
    grid = build_grid(trace, jobs, 600, 0)
    oracle = Oracle(Hindsight.of(grid))
    run = run_policy(oracle, jobs, grid, options=LoopOptions())
    f = run.fleet
    assert (f.phase == Phase.DONE).all()
    assert (f.finished_at_s <= np.array([j.deadline.timestamp() for j in jobs]) + 1e-6).all()
    assert not [e for e in run.events if e.kind is EventKind.REJECTED]
    plans = oracle.plans
    assert all(p.first_tick == 0 for p in plans.values())  # nobody left its plan
    spot = next(k for k, o in enumerate(grid.offers) if o.market is Market.SPOT)
    booked = np.zeros(grid.n_ticks + 1)
    for p in plans.values():
        on = np.append(p.target == spot, False)
        booked[: len(on)] += on | np.insert(on[:-1], 0, False)
    assert booked.max() == 1  # one slot, one holder per tick
    for spec in jobs:  # alone, each job would plan the slot: the ledger made b go around
        solo = Oracle(Hindsight.of(grid))
        run_policy(solo, [spec], grid, options=LoopOptions())
        assert (solo.plans[spec.id].target == spot).any()


def test_unreachable_deadline_finishes_as_soon_as_possible() -> None:
    spec = job(work=10.0, hours=3.0)  # 10 GPU-h in 3 h: impossible on any offer
    grid = _extended(build_grid(tiny_trace(), [spec], 600, 0), 30)
    oracle = Oracle(Hindsight.of(grid))
    run = run_policy(oracle, [spec], grid, options=LoopOptions())
    plan = oracle.plans[spec.id]
    assert plan.fallback and not plan.meets_deadline
    a100 = catalog.gpu("A100-80GB").relative_throughput
    v100 = catalog.gpu("V100").relative_throughput
    fastest = max(a100, v100)
    assert run.fleet.finished_at_s[0] == pytest.approx(
        T0.timestamp() + (0.1 + 10.0 / fastest) * 3600
    )


def _extended(grid: SignalGrid, hours: int) -> SignalGrid:
    """The grid with its last row repeated to `hours` hours (late jobs can finish)."""
    n = int(hours * 3600 / grid.tick_s)
    extra = n - grid.n_ticks

    def grow(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.concatenate([a, np.repeat(a[-1:], extra, axis=0)]) if extra > 0 else a

    return replace(
        grid,
        usd_per_hour=grow(grid.usd_per_hour),
        spot_capacity=grow(grid.spot_capacity),
        carbon_g_per_kwh=grow(grid.carbon_g_per_kwh),
        carbon_marginal_g_per_kwh=grow(grid.carbon_marginal_g_per_kwh),
        carbon_hourly_known=grow(grid.carbon_hourly_known),
        curtailing=grow(grid.curtailing),
    )


def test_registry_oracle_is_bound_by_the_replay_and_works_unbound() -> None:
    oracle = make_policy("oracle")
    assert isinstance(oracle, Oracle) and oracle.name == "oracle" and oracle.hindsight is None
    spec = job()
    grid = build_grid(tiny_trace(), [spec], 600, 0)
    run = run_policy(oracle, [spec], grid, options=LoopOptions())  # run_policy binds the grid
    bound = run_policy(Oracle(Hindsight.of(grid)), [spec], grid, options=LoopOptions())
    assert run.fleet.usd[0] == pytest.approx(bound.fleet.usd[0])
    # Unbound (live): plans on the present held constant, and still decides.
    captured: list[Decision] = []
    unbound = Oracle()

    class Spy:
        name = "spy"

        def __call__(self, snapshot: Snapshot) -> Decision:
            captured.append(unbound(snapshot))
            return captured[-1]

    run_policy(Spy(), [spec], grid, options=LoopOptions())
    assert captured and isinstance(captured[0], Decision) and captured[0].intents


def test_hindsight_on_another_tick_grid_is_refused() -> None:
    spec = job()
    grid = build_grid(tiny_trace(), [spec], 600, 0)
    other = build_grid(tiny_trace(), [spec], 300, 0)
    with pytest.raises(ValueError, match="tick grid"):
        run_policy(Oracle(Hindsight.of(other)), [spec], grid, options=LoopOptions())


# --- 3. the skynomad-h100 suite, one window -------------------------------------------------


@pytest.mark.traces
def test_skynomad_h100_window_shape_and_oracle(shared_data: Path) -> None:
    from orchestrator.replay.suites import case_grid, skynomad_h100

    suite = skynomad_h100(shared_data, {"start_ticks": [0]})
    assert len(suite.cases) == 1
    case = suite.cases[0]
    (spec,) = case.jobs
    assert case.tick_s == 600
    assert case.settings == CostSettings(
        egress_usd_per_gb=0.02, transfer_time=False, bill_final_tick=True
    )
    assert spec.work_gpu_hours * 3600 == pytest.approx(124_400)
    assert (spec.deadline - spec.start).total_seconds() == 311 * 600
    assert spec.start.isoformat() == "2025-10-04T00:10:00+00:00"
    assert spec.cold_start_h == 0.2 and spec.checkpoint_size_gb == 50.0
    assert spec.checkpoint_interval_h == 0.0
    grid = case_grid(case)
    assert len(grid.offers) == 12  # 6 zones x (spot, on-demand)
    assert {o.zone for o in grid.offers} == {
        "us-central1-a",
        "us-west1-a",
        "europe-west1-c",
        "europe-west3-c",
        "asia-southeast1-b",
        "asia-south2-b",
    }
    assert grid.n_ticks >= 311
    assert not np.isnan(grid.spot_capacity).any()
    assert set(
        np.unique(grid.spot_capacity[:, [o.market.value == "spot" for o in grid.offers]])
    ) <= {0.0, 1.0}
    oracle = Oracle(Hindsight.of(grid))
    run = run_policy(oracle, case.jobs, grid, options=LoopOptions(settings=case.settings))
    plan = oracle.plans[spec.id]
    assert plan.exact and plan.meets_deadline
    assert run.fleet.phase[0] == Phase.DONE
    assert run.fleet.finished_at_s[0] <= spec.deadline.timestamp() + 1e-6
    assert float(run.fleet.usd[0]) == pytest.approx(plan.dp_objective_usd, rel=1e-9)
    # Window t0: 34.556 h of spot at the cheapest zone plus cold starts and moves.
    assert 560.0 < float(run.fleet.usd[0]) < 600.0


@pytest.mark.traces
def test_suite_api_one_window(shared_data: Path) -> None:
    import json

    from orchestrator.errors import InputError, UnknownNameError
    from orchestrator.replay.suites import SUITES, case_grid, cbl_v100, run_suite

    assert set(SUITES) == {"skynomad-h100", "cbl-v100", "carbon-year"}
    seen: list[tuple[str, int, int]] = []
    result = run_suite(
        "skynomad-h100",
        shared_data,
        ["on-demand"],
        {"start_ticks": "0"},
        progress=lambda what, done, total: seen.append((what, done, total)),
    )
    assert result.policies == ("oracle", "on-demand")
    assert seen[-1] == ("done", 2, 2)
    oracle, on_demand = result.policy("oracle"), result.policy("on-demand")
    assert oracle.deadlines_met == oracle.jobs == 1 and oracle.regret == 0.0
    assert on_demand.regret is not None and on_demand.regret > 1.0  # 82.5 vs ~16.4 USD/h
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["suite"] == "skynomad-h100" and len(doc["windows"]) == 2
    assert doc["summary"][0]["deadlines_total"] == 1
    assert "oracle" in result.format_table()
    with pytest.raises(InputError, match="deadline_ratio"):
        run_suite("skynomad-h100", shared_data, [], {"deadline_ratios": 1.2})
    with pytest.raises(UnknownNameError):
        run_suite("no-such-suite", shared_data, [])
    with pytest.raises(UnknownNameError):
        run_suite("skynomad-h100", shared_data, ["no-such-policy"])

    cbl = cbl_v100(shared_data, {"start_ticks": [0]})
    assert [c.setting for c in cbl.cases] == [
        "slack 4 h, cold 0.05 h",
        "slack 4 h, cold 0.2 h",
        "slack 22 h, cold 0.05 h",
        "slack 22 h, cold 0.2 h",
    ]
    case = cbl.cases[-1]
    (spec,) = case.jobs
    assert case.tick_s == 195 and spec.work_gpu_hours == 48.0
    assert (spec.deadline - spec.start) == timedelta(hours=70)
    grid = case_grid(case)
    assert len(grid.offers) == 18  # 9 zones x (spot, on-demand)
    on_demand_cols = [k for k, o in enumerate(grid.offers) if o.market.value == "on_demand"]
    assert np.allclose(grid.usd_per_hour[:, on_demand_cols], 3.06)


@pytest.mark.traces
def test_suite_workers_give_the_same_results(shared_data: Path) -> None:
    from orchestrator.replay.suites import run_suite

    options = {"start_ticks": "0,311", "work_hours": 6.0, "deadline_ratio": 2.0}
    one = run_suite("skynomad-h100", shared_data, ["spot-failover"], options)
    two = run_suite("skynomad-h100", shared_data, ["spot-failover"], options, workers=2)
    assert [w.window for w in two.windows] == ["t0", "t0", "t311", "t311"]
    assert one.windows == two.windows


@pytest.mark.traces
def test_carbon_year_window_shares_capacity_and_skips_unpriced_gpus(shared_data: Path) -> None:
    """The Toronto A100 shapes (listed at the bare VM's price) are left out, and the oracle's
    plans for a window of several jobs never book more spot instances than the trace has."""
    from orchestrator.replay.suites import carbon_year, case_grid

    suite = carbon_year(
        shared_data, {"windows": 1, "jobs_per_window": 3, "carbon_prices": [200], "window_days": 3}
    )
    assert "northamerica-northeast2 a2-highgpu-1g" in suite.config["dropped_unpriced_gpu"]
    (case,) = suite.cases
    grid = case_grid(case)
    toronto = {o.instance_type for o in grid.offers if o.region == "northamerica-northeast2"}
    assert toronto and not toronto & {"a2-highgpu-1g", "a2-highgpu-8g"}  # ultragpu is priced
    oracle = Oracle(Hindsight.of(grid), max_progress_levels=suite.oracle_levels)
    run = run_policy(oracle, case.jobs, grid, options=LoopOptions(settings=case.settings))
    assert not [e for e in run.events if e.kind is EventKind.REJECTED]
    booked = oracle._cache["ledger"].reserved
    spot = np.array([o.market is Market.SPOT for o in grid.offers])
    assert (booked[:, spot] <= grid.spot_capacity[:, spot] + 1e-9).all()
    assert (run.fleet.phase == Phase.DONE).all()
