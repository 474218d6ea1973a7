"""Table-driven tests of the baseline policies (policies/baselines) and the policy registry.

Every test builds a tiny world by hand: three regions on two clouds, one on-demand and one
spot offer of 8 x A100-80GB in each, one job of 8 GPUs (rate 8 reference GPU-hours per hour).
A row is (situation, expected intent): `KEEP` when the policy must not name the job, an offer
index to run on, or `PAUSE`.

Offer indices:  0 aws us-east-1 on-demand   1 aws us-east-1 spot      (grid zone PJM)
                2 aws us-west-2 on-demand   3 aws us-west-2 spot      (grid zone CAISO)
                4 gcp europe-west4 on-demand 5 gcp europe-west4 spot  (grid zone NL)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from orchestrator.costs import JobOfferFit
from orchestrator.errors import InputError, UnknownNameError
from orchestrator.model import (
    Decision,
    FleetState,
    JobSpec,
    Market,
    Offer,
    Phase,
)
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.history import SignalHistory
from policies.base import Policy, Snapshot
from policies.baselines import (
    CarbonGreedy,
    CurtailmentThreshold,
    OnDemand,
    SpotFailover,
    UniformProgress,
)
from policies.registry import POLICY_NAMES, make_policy

T0 = datetime(2024, 3, 1, tzinfo=UTC)
KEEP = "keep"
PAUSE = "pause"
Expected = int | str  # offer index, KEEP or PAUSE

# (cloud, region, grid zone) of offers 0/1, 2/3, 4/5.
REGIONS = (
    ("aws", "us-east-1", "PJM"),
    ("aws", "us-west-2", "CAISO"),
    ("gcp", "europe-west4", "NL"),
)
THROUGHPUT = {"A100-80GB": 1.0, "H100": 2.5}  # overrides: tests do not depend on the catalog


def offer(
    cloud: str,
    region: str,
    zone: str,
    market: Market,
    *,
    gpu: str = "A100-80GB",
    instance_type: str = "p4de.24xlarge",
) -> Offer:
    return Offer(
        id=Offer.make_id(cloud, region + "a", instance_type, market),
        cloud=cloud,
        region=region,
        zone=region + "a",
        instance_type=instance_type,
        gpu_type=gpu,
        gpu_count=8,
        market=market,
        grid_zone=zone,
        power_kw=10.0,
        pue=1.25,
    )


BASE_OFFERS = tuple(
    offer(c, r, z, m) for c, r, z in REGIONS for m in (Market.ON_DEMAND, Market.SPOT)
)


def job(**over: Any) -> JobSpec:
    spec = JobSpec(
        id="j0",
        work_gpu_hours=64.0,
        gpus=8,
        start=T0,
        deadline=T0 + timedelta(hours=32),
        checkpoint_size_gb=10.0,
        cold_start_h=0.5,
        home_region="us-east-1",
        throughput=THROUGHPUT,
        checkpoint_interval_h=0.0,
    )
    return replace(spec, **over)


@dataclass
class World:
    """One situation. Per-offer overrides are {offer index: value}; fleet fields are per job
    (a scalar applies to the single default job)."""

    usd_per_hour: Mapping[int, float] = field(default_factory=dict)
    spot_capacity: Mapping[int, float] = field(default_factory=dict)
    carbon: Mapping[int, float] = field(default_factory=dict)
    marginal: Mapping[int, float] = field(default_factory=dict)
    curtailing: Mapping[int, bool] = field(default_factory=dict)
    extra_offers: Sequence[Offer] = ()
    jobs: Sequence[JobSpec] = ()
    phase: Phase | Sequence[Phase] = Phase.WAITING
    offer: int | Sequence[int] = -1
    preempted: int | Sequence[int] = -1
    progress: float | Sequence[float] = 0.0
    now_h: float = 8.0
    tick_h: float = 0.25
    history_rows: Sequence[Mapping[str, Mapping[int, float]]] | None = None

    def snapshot(self) -> Snapshot:
        offers = list(BASE_OFFERS) + list(self.extra_offers)
        n = len(offers)
        price = np.array([40.0 if o.market is Market.ON_DEMAND else 10.0 for o in offers])
        price[:6] = [40.0, 10.0, 32.0, 8.0, 36.0, 12.0]
        capacity = np.array([math.inf if o.market is Market.ON_DEMAND else 5.0 for o in offers])
        zone_carbon = {"PJM": 400.0, "CAISO": 300.0, "NL": 200.0}
        zone_marginal = {"PJM": 500.0, "CAISO": 80.0, "NL": math.nan}
        carbon = np.array([zone_carbon[o.grid_zone] for o in offers])
        marginal = np.array([zone_marginal[o.grid_zone] for o in offers])
        curtailing = np.zeros(n, dtype=np.bool_)
        for arr, over in (
            (price, self.usd_per_hour),
            (capacity, self.spot_capacity),
            (carbon, self.carbon),
            (marginal, self.marginal),
            (curtailing, self.curtailing),
        ):
            for k, v in over.items():
                arr[k] = v
        jobs = list(self.jobs) or [job()]
        fleet = FleetState.empty(len(jobs))
        fleet.phase[:] = _per_job(self.phase, len(jobs))
        fleet.offer[:] = _per_job(self.offer, len(jobs))
        fleet.preempted_offer[:] = _per_job(self.preempted, len(jobs))
        fleet.progress_gpu_h[:] = _per_job(self.progress, len(jobs))
        fleet.checkpointed_gpu_h[:] = fleet.progress_gpu_h
        now = T0 + timedelta(hours=self.now_h)
        history = None
        if self.history_rows is not None:
            history = _history(
                offers,
                self.tick_h,
                self.history_rows,
                price=price,
                capacity=capacity,
                carbon=carbon,
                marginal=marginal,
                curtailing=curtailing,
            )
        return Snapshot(
            now=now,
            now_s=now.timestamp(),
            tick_h=self.tick_h,
            offers=offers,
            usd_per_hour=price,
            spot_capacity=capacity,
            carbon_g_per_kwh=carbon,
            carbon_marginal_g_per_kwh=marginal,
            curtailing=curtailing,
            jobs=jobs,
            fleet=fleet.frozen_copy(),
            fit=JobOfferFit.build(jobs, offers),
            history=history,
        )


def _per_job(value: Any, n: int) -> list[Any]:
    if isinstance(value, (list, tuple)):
        assert len(value) == n
        return list(value)
    return [value] * n


def _history(
    offers: Sequence[Offer],
    tick_h: float,
    past: Sequence[Mapping[str, Mapping[int, float]]],
    *,
    price: np.ndarray,
    capacity: np.ndarray,
    carbon: np.ndarray,
    marginal: np.ndarray,
    curtailing: np.ndarray,
) -> SignalHistory:
    """Rows before now (oldest first), each overriding "marginal"/"carbon"/"curtailing" of
    the current values, then the current row."""
    rows = []
    for over in [*past, {}]:
        row = {
            "marginal": marginal.copy(),
            "carbon": carbon.copy(),
            "curtailing": curtailing.astype(float),
        }
        for key, cols in over.items():
            for k, v in cols.items():
                row[key][k] = v
        rows.append(row)
    n_rows = len(rows)
    grid = SignalGrid(
        start=T0,
        tick_s=round(tick_h * 3600),
        offers=tuple(offers),
        usd_per_hour=np.tile(price, (n_rows, 1)),
        spot_capacity=np.tile(capacity, (n_rows, 1)),
        carbon_g_per_kwh=np.stack([r["carbon"] for r in rows]),
        carbon_marginal_g_per_kwh=np.stack([r["marginal"] for r in rows]),
        carbon_hourly_known=np.ones((n_rows, len(offers)), dtype=np.bool_),
        curtailing=np.stack([r["curtailing"] for r in rows]) > 0.5,
    )
    return SignalHistory(grid, n_rows - 1)


def decide(policy: Policy, world: World, job_index: int = 0) -> tuple[Expected, str]:
    decision = policy(world.snapshot())
    assert isinstance(decision, Decision)
    intent = decision.intents.get(job_index)
    if intent is None:
        return KEEP, ""
    assert intent.reason, "every intent carries a reason"
    return (PAUSE if intent.offer is None else intent.offer), intent.reason


def check(policy: Policy, world: World, expected: Expected) -> str:
    got, reason = decide(policy, world)
    assert got == expected, reason
    if expected != KEEP:
        assert any(ch.isdigit() for ch in reason), f"reason without numbers: {reason}"
    return reason


H100_EAST_OD = offer(
    "aws", "us-east-1", "PJM", Market.ON_DEMAND, gpu="H100", instance_type="p5.48xlarge"
)  # offer 6 where added

# --- on-demand -------------------------------------------------------------------------

ON_DEMAND_ROWS: list[tuple[str, World, Expected]] = [
    ("waiting: home region's on-demand even though us-west-2 is cheaper", World(), 0),
    ("waiting, home us-west-2", World(jobs=[job(home_region="us-west-2")]), 2),
    ("never spot, even when it is cheaper and available", World(usd_per_hour={1: 1.0}), 0),
    ("home on-demand has no price: keep waiting", World(usd_per_hour={0: math.nan}), KEEP),
    (
        "cheapest per unit of progress, not per hour: H100 at 90 $/h = 4.5 $/GPU-h < 5",
        World(extra_offers=[H100_EAST_OD], usd_per_hour={6: 90.0}),
        6,
    ),
    (
        "H100 at 100 $/h = 5 $/GPU-h ties with A100: lowest index",
        World(extra_offers=[H100_EAST_OD], usd_per_hour={6: 100.0}),
        0,
    ),
    ("running: never moves", World(phase=Phase.RUNNING, offer=0, usd_per_hour={0: 99.0}), KEEP),
    ("starting: never moves", World(phase=Phase.STARTING, offer=0), KEEP),
    ("pending: before its start", World(phase=Phase.PENDING), KEEP),
    ("done", World(phase=Phase.DONE), KEEP),
    ("GPU type not allowed", World(jobs=[job(gpu_types=frozenset({"V100"}))]), KEEP),
]


@pytest.mark.parametrize(
    ("situation", "world", "expected"), ON_DEMAND_ROWS, ids=[r[0] for r in ON_DEMAND_ROWS]
)
def test_on_demand(situation: str, world: World, expected: Expected) -> None:
    check(OnDemand(), world, expected)


# --- spot-failover ---------------------------------------------------------------------

SPOT_FAILOVER_ROWS: list[tuple[str, World, Expected]] = [
    ("waiting: cheapest spot anywhere (us-west-2, 8 $/h)", World(), 3),
    ("preempted in us-west-2: next cheapest elsewhere", World(preempted=3), 1),
    (
        "preempted in us-west-2, the only spot left: allowed again",
        World(preempted=3, spot_capacity={1: 0.0, 5: 0.0}),
        3,
    ),
    (
        "preempted on us-west-2 on-demand: that region is blocked for spot too",
        World(preempted=2),
        1,
    ),
    (
        "no spot anywhere: wait, never on-demand",
        World(spot_capacity={1: 0.0, 3: 0.0, 5: 0.0}),
        KEEP,
    ),
    ("unknown capacity counts as unavailable", World(spot_capacity={3: math.nan}), 1),
    ("capacity below the job's 2 instances", World(jobs=[job(gpus=16)], spot_capacity={3: 1.0}), 1),
    ("no price: never chosen", World(usd_per_hour={3: math.nan}), 1),
    ("running: stays even when cheaper spot exists", World(phase=Phase.RUNNING, offer=5), KEEP),
    ("starting: stays", World(phase=Phase.STARTING, offer=1), KEEP),
    ("pending", World(phase=Phase.PENDING), KEEP),
]


@pytest.mark.parametrize(
    ("situation", "world", "expected"), SPOT_FAILOVER_ROWS, ids=[r[0] for r in SPOT_FAILOVER_ROWS]
)
def test_spot_failover(situation: str, world: World, expected: Expected) -> None:
    reason = check(SpotFailover(), world, expected)
    if situation.startswith("preempted in us-west-2, the only"):
        assert "allowed it again" in reason


# --- uniform-progress ------------------------------------------------------------------
# Job: W = 64 GPU-h, rate 8/h, d = 0.5 h, start T0, deadline T0 + 32 h: the line rises
# 2 GPU-h per hour. At now = 8 h the line is at 16; hysteresis: ep(t + 2d) = ep(9 h) = 18.
# Safety-net slack = (32 - now) - 0.5 - (64 - p) / 8; it fires when slack <= tick = 0.25.
# At now = 25.75 h and p = 20: slack = 6.25 - 0.5 - 5.5 = 0.25 (fires); at 25.5 h: 0.5.

NO_HOME_SPOT = {1: 0.0}

UNIFORM_PROGRESS_ROWS: list[tuple[str, World, Expected]] = [
    (
        "waiting on the line, spot available: home spot (not cheaper us-west-2)",
        World(progress=16.0),
        1,
    ),
    (
        "waiting behind the line, spot available: still spot (Can't Be Late)",
        World(progress=15.0),
        1,
    ),
    ("waiting on the line, no spot: wait", World(progress=16.0, spot_capacity=NO_HOME_SPOT), KEEP),
    (
        "waiting ahead of the line, no spot: wait",
        World(progress=30.0, spot_capacity=NO_HOME_SPOT),
        KEEP,
    ),
    (
        "waiting just behind the line, no spot: on-demand",
        World(progress=15.875, spot_capacity=NO_HOME_SPOT),
        0,
    ),
    (
        "waiting behind, home spot capacity unknown: on-demand",
        World(progress=10.0, spot_capacity={1: math.nan}),
        0,
    ),
    (
        "running on spot behind the line: stays",
        World(phase=Phase.RUNNING, offer=1, progress=10.0),
        KEEP,
    ),
    (
        "on on-demand, 17.875 < ep(t + 2d) = 18, spot available: stays",
        World(phase=Phase.RUNNING, offer=0, progress=17.875),
        KEEP,
    ),
    (
        "on on-demand, at ep(t + 2d) = 18 exactly, spot available: back to spot",
        World(phase=Phase.RUNNING, offer=0, progress=18.0),
        1,
    ),
    (
        "on on-demand, at ep(t + 2d), no spot: pause (idle, as in the paper)",
        World(phase=Phase.RUNNING, offer=0, progress=18.0, spot_capacity=NO_HOME_SPOT),
        PAUSE,
    ),
    (
        "on on-demand ahead of the line but < ep(t + 2d), no spot: stays",
        World(phase=Phase.RUNNING, offer=0, progress=17.0, spot_capacity=NO_HOME_SPOT),
        KEEP,
    ),
    (
        "on on-demand behind the line, spot available: stays",
        World(phase=Phase.RUNNING, offer=0, progress=10.0),
        KEEP,
    ),
    (
        "safety net at slack = tick exactly: on-demand although spot is available",
        World(now_h=25.75, progress=20.0),
        0,
    ),
    ("slack = 2 ticks: not yet, spot", World(now_h=25.5, progress=20.0), 1),
    (
        "safety net while running on spot: move to on-demand",
        World(now_h=25.75, progress=20.0, phase=Phase.RUNNING, offer=1),
        0,
    ),
    (
        "safety net while on on-demand: stays",
        World(now_h=25.75, progress=20.0, phase=Phase.RUNNING, offer=0),
        KEEP,
    ),
    (
        "safety net while starting on on-demand: stays",
        World(now_h=25.75, progress=20.0, phase=Phase.STARTING, offer=0),
        KEEP,
    ),
    (
        "H100 on-demand makes slack 2.75 - 0.5 - 44 / 20 = 0.05 h at now 29.25; before that: spot",
        World(now_h=29.0, progress=20.0, extra_offers=[H100_EAST_OD], usd_per_hour={6: 400.0}),
        1,
    ),
    (
        "safety net past hope (slack < 0): still on-demand, the best it can do",
        World(now_h=30.0, progress=20.0),
        0,
    ),
    (
        "safety net with the fastest on-demand (H100, rate 20): 2.75 - 0.5 - 44 / 20 = 0.05",
        World(now_h=29.25, progress=20.0, extra_offers=[H100_EAST_OD], usd_per_hour={6: 400.0}),
        6,
    ),
    ("pending", World(phase=Phase.PENDING), KEEP),
    ("done", World(phase=Phase.DONE, progress=64.0), KEEP),
]


@pytest.mark.parametrize(
    ("situation", "world", "expected"),
    UNIFORM_PROGRESS_ROWS,
    ids=[r[0] for r in UNIFORM_PROGRESS_ROWS],
)
def test_uniform_progress(situation: str, world: World, expected: Expected) -> None:
    reason = check(UniformProgress(), world, expected)
    if "safety net" in situation and expected != KEEP:
        assert reason.count("safety net") == 1


def _simulate_uniform_progress(
    spot_up: Sequence[bool], span_h: float, tick_h: float = 0.25
) -> tuple[float, bool, list[int]]:
    """Drive UniformProgress tick by tick on a one-job world whose home spot capacity
    follows `spot_up` (a spot instance is preempted, losing nothing, when it goes down).
    Returns (finish hour, whether the job stayed on on-demand from the first safety-net
    intent on, the offer held at each tick)."""
    policy = UniformProgress()
    spec = job(deadline=T0 + timedelta(hours=span_h))
    rate, d = 8.0, spec.cold_start_h
    phase, held, preempted, progress, ready_h = Phase.WAITING, -1, -1, 0.0, math.nan
    netted, stayed_on_od, trace = False, True, []
    for k in range(len(spot_up)):
        now = k * tick_h
        capacity = {1: 5.0 if spot_up[k] else 0.0}
        if held == 1 and not spot_up[k]:
            phase, held, preempted = Phase.WAITING, -1, 1
        world = World(
            jobs=[spec],
            phase=phase,
            offer=held,
            preempted=preempted,
            progress=progress,
            now_h=now,
            tick_h=tick_h,
            spot_capacity=capacity,
        )
        intent = policy(world.snapshot()).intents.get(0)
        if intent is not None:
            netted |= "safety net" in intent.reason
            if intent.offer is None:
                phase, held = Phase.WAITING, -1
            elif intent.offer != 1 or spot_up[k]:  # the planner refuses spot without capacity
                phase, held, ready_h = Phase.STARTING, intent.offer, now + d
        if netted and held != 0:
            stayed_on_od = False
        trace.append(held)
        if phase in (Phase.STARTING, Phase.RUNNING):
            run_from = max(now, ready_h)
            progress += rate * max(0.0, now + tick_h - run_from)
            if ready_h <= now + tick_h:
                phase = Phase.RUNNING
            if progress >= spec.work_gpu_hours:
                return now + tick_h - (progress - spec.work_gpu_hours) / rate, stayed_on_od, trace
    return math.inf, stayed_on_od, trace


def _spot_patterns(n: int) -> dict[str, list[bool]]:
    rng = np.random.default_rng(7)
    patterns = {
        "always": [True] * n,
        "never": [False] * n,
        "gone after 3 h": [k < 12 for k in range(n)],
        "flapping every tick": [k % 2 == 0 for k in range(n)],
        "up 1 h / down 1 h": [(k // 4) % 2 == 0 for k in range(n)],
        "only near the end": [k > n - 8 for k in range(n)],
    }
    for seed in range(6):
        p_up = (0.2, 0.5, 0.8)[seed % 3]
        patterns[f"random {seed} p={p_up}"] = list(rng.random(n) < p_up)
    return patterns


# 8 h of work at rate 8 plus one cold start of 0.5 h: the safety net can meet any deadline
# at least 8.5 h after the start.
@pytest.mark.parametrize("span_h", [8.5, 9.0, 10.0, 12.25, 16.0])
def test_uniform_progress_never_misses_a_deadline_its_safety_net_can_meet(span_h: float) -> None:
    n = int(span_h / 0.25) + 8
    for name, spot_up in _spot_patterns(n).items():
        finish_h, stayed_on_od, trace = _simulate_uniform_progress(spot_up, span_h)
        assert finish_h <= span_h + 1e-9, f"{name}: finished at {finish_h} h > {span_h} h {trace}"
        assert stayed_on_od, f"{name}: left on-demand after the safety net: {trace}"


def test_uniform_progress_uses_spot_when_it_can() -> None:
    finish_h, _, trace = _simulate_uniform_progress([True] * 80, 16.0)
    assert finish_h == 8.5
    assert set(trace) == {1}


# --- carbon-greedy ---------------------------------------------------------------------
# All offers: 10 kW x PUE 1.25 / rate 8 = 1.5625 kWh per GPU-h, so the score is the zone's
# intensity x 1.5625: PJM 400, CAISO 300, NL 200 g/kWh.

CARBON_GREEDY_ROWS: list[tuple[str, CarbonGreedy, World, Expected]] = [
    (
        "waiting: cleanest on-demand (NL), whatever the price",
        CarbonGreedy(),
        World(usd_per_hour={4: 500.0}),
        4,
    ),
    ("cleanest has no price: next (CAISO)", CarbonGreedy(), World(usd_per_hour={4: math.nan}), 2),
    (
        "never spot, even where the spot offer is the only one priced in NL",
        CarbonGreedy(),
        World(usd_per_hour={4: math.nan, 5: 1.0}),
        2,
    ),
    ("unknown intensity is never chosen", CarbonGreedy(), World(carbon={4: math.nan, 5: 1.0}), 2),
    (
        "running in CAISO (300), NL 200 < 0.8 x 300: move",
        CarbonGreedy(),
        World(phase=Phase.RUNNING, offer=2),
        4,
    ),
    (
        "running in CAISO, NL 250 > 240: stay",
        CarbonGreedy(),
        World(phase=Phase.RUNNING, offer=2, carbon={4: 250.0, 5: 250.0}),
        KEEP,
    ),
    (
        "hysteresis 0.25: NL 225 = 0.75 x 300 exactly: stay",
        CarbonGreedy(hysteresis=0.25),
        World(phase=Phase.RUNNING, offer=2, carbon={4: 225.0, 5: 225.0}),
        KEEP,
    ),
    (
        "hysteresis 0.25: NL 224 < 225: move",
        CarbonGreedy(hysteresis=0.25),
        World(phase=Phase.RUNNING, offer=2, carbon={4: 224.0, 5: 224.0}),
        4,
    ),
    (
        "starting on the best already: stay",
        CarbonGreedy(),
        World(phase=Phase.STARTING, offer=4),
        KEEP,
    ),
    (
        "current intensity unknown: stay",
        CarbonGreedy(),
        World(phase=Phase.RUNNING, offer=2, carbon={2: math.nan}),
        KEEP,
    ),
    (
        "GPU type not allowed anywhere",
        CarbonGreedy(),
        World(jobs=[job(gpu_types=frozenset({"V100"}))]),
        KEEP,
    ),
    (
        "per unit of progress: H100 in PJM (7 kW x 1.25 / 20 x 400 = 175) beats NL (312.5)",
        CarbonGreedy(),
        World(extra_offers=[replace(H100_EAST_OD, power_kw=7.0)]),
        6,
    ),
]


@pytest.mark.parametrize(
    ("situation", "policy", "world", "expected"),
    CARBON_GREEDY_ROWS,
    ids=[r[0] for r in CARBON_GREEDY_ROWS],
)
def test_carbon_greedy(
    situation: str, policy: CarbonGreedy, world: World, expected: Expected
) -> None:
    check(policy, world, expected)


# --- curtailment-threshold -------------------------------------------------------------
# Marginal: PJM 500, CAISO 80, NL unknown (average 200; 0 while curtailing). Threshold 100.
# tick 0.25 h = 900 s >= 600 s: without history a job leaves on the first tick above.

FIVE_MIN = 300 / 3600

CURTAILMENT_ROWS: list[tuple[str, World, Expected]] = [
    ("waiting: CAISO marginal 80 < 100", World(), 2),
    (
        "waiting: a curtailing zone first (NL, marginal unknown -> 0)",
        World(curtailing={4: True, 5: True}),
        4,
    ),
    (
        "curtailing beats lower marginal: NL curtailing with marginal 90 vs CAISO 80",
        World(curtailing={4: True, 5: True}, marginal={4: 90.0, 5: 90.0}),
        4,
    ),
    (
        "curtailing counts even with marginal above the threshold",
        World(curtailing={0: True, 1: True}, marginal={2: 150.0, 3: 150.0}),
        0,
    ),
    (
        "among clean zones, the cheapest: CAISO at 32 $/h before NL at 36",
        World(marginal={4: 50.0, 5: 50.0}),
        2,
    ),
    (
        "among clean zones, the cheapest: NL when it is cheaper",
        World(marginal={4: 50.0, 5: 50.0}, usd_per_hour={4: 30.0}),
        4,
    ),
    ("nothing below 100: keep waiting", World(marginal={2: 100.0, 3: 100.0}), KEEP),
    (
        "on-demand only: CAISO on-demand unpriced, its spot priced: wait",
        World(usd_per_hour={2: math.nan}),
        KEEP,
    ),
    (
        "running in CAISO: stays although NL curtails",
        World(phase=Phase.RUNNING, offer=2, curtailing={4: True}),
        KEEP,
    ),
    (
        "running in PJM (500), one 900 s tick, no history: leaves for CAISO",
        World(phase=Phase.RUNNING, offer=0),
        2,
    ),
    (
        "running in PJM, 300 s tick, no history: 300 s known < 600: stays",
        World(phase=Phase.RUNNING, offer=0, tick_h=FIVE_MIN),
        KEEP,
    ),
    (
        "running in PJM, 300 s ticks, above now and the tick before: 600 s, leaves",
        World(phase=Phase.RUNNING, offer=0, tick_h=FIVE_MIN, history_rows=[{}, {}]),
        2,
    ),
    (
        "running in PJM, 300 s ticks, below the tick before: 300 s, stays",
        World(
            phase=Phase.RUNNING,
            offer=0,
            tick_h=FIVE_MIN,
            history_rows=[{}, {"marginal": {0: 50.0, 1: 50.0}}],
        ),
        KEEP,
    ),
    (
        "running in PJM, curtailing the tick before: 300 s, stays",
        World(
            phase=Phase.RUNNING,
            offer=0,
            tick_h=FIVE_MIN,
            history_rows=[{}, {"curtailing": {0: 1.0, 1: 1.0}}],
        ),
        KEEP,
    ),
    (
        "running in PJM, history of one row only (start of replay): 300 s, stays",
        World(phase=Phase.RUNNING, offer=0, tick_h=FIVE_MIN, history_rows=[]),
        KEEP,
    ),
    (
        "running in PJM above too long, no qualifying offer: pause",
        World(phase=Phase.RUNNING, offer=0, marginal={2: 120.0, 3: 120.0}),
        PAUSE,
    ),
    ("starting in PJM above: same rule", World(phase=Phase.STARTING, offer=0), 2),
]


@pytest.mark.parametrize(
    ("situation", "world", "expected"), CURTAILMENT_ROWS, ids=[r[0] for r in CURTAILMENT_ROWS]
)
def test_curtailment_threshold(situation: str, world: World, expected: Expected) -> None:
    check(CurtailmentThreshold(), world, expected)


def test_curtailment_threshold_options() -> None:
    stricter = CurtailmentThreshold(threshold_g_per_kwh=50.0)
    assert decide(stricter, World())[0] == KEEP
    patient = CurtailmentThreshold(leave_after_s=1800.0)
    assert decide(patient, World(phase=Phase.RUNNING, offer=0))[0] == KEEP
    assert decide(patient, World(phase=Phase.RUNNING, offer=0, history_rows=[{}, {}]))[0] == 2


# --- every policy ----------------------------------------------------------------------

ALL: list[Policy] = [
    OnDemand(),
    SpotFailover(),
    UniformProgress(),
    CarbonGreedy(),
    CurtailmentThreshold(),
]


@pytest.mark.parametrize("policy", ALL, ids=[p.name for p in ALL])
def test_only_jobs_that_change_are_named_and_indices_line_up(policy: Policy) -> None:
    jobs = [job(id=f"j{k}") for k in range(5)]
    world = World(
        jobs=jobs,
        phase=[Phase.PENDING, Phase.DONE, Phase.WAITING, Phase.RUNNING, Phase.WAITING],
        offer=[-1, -1, -1, 4, -1],
        progress=[0.0, 64.0, 16.0, 16.0, 16.0],
        # job 3 runs in NL on on-demand, which every policy here is content with
        marginal={4: 50.0, 5: 50.0},
    )
    snapshot = world.snapshot()
    first = policy(snapshot)
    assert set(first.intents) == {2, 4}
    assert first.intents[2].offer == first.intents[4].offer
    assert policy(snapshot) == first  # pure


def test_nothing_to_do_when_all_done() -> None:
    empty = World(jobs=[job()], phase=Phase.DONE).snapshot()
    for policy in ALL:
        assert policy(empty).intents == {}


# --- registry --------------------------------------------------------------------------


def test_registry_knows_every_baseline() -> None:
    assert set(POLICY_NAMES) >= {
        "on-demand",
        "spot-failover",
        "uniform-progress",
        "carbon-greedy",
        "curtailment-threshold",
    }
    for name in POLICY_NAMES:
        policy = make_policy(name)
        assert policy.name == name
        assert isinstance(policy(World().snapshot()), Decision)


def test_registry_passes_options() -> None:
    policy = make_policy("carbon-greedy", hysteresis=0.5)
    assert isinstance(policy, CarbonGreedy)
    assert policy.hysteresis == 0.5


def test_registry_unknown_name() -> None:
    with pytest.raises(UnknownNameError) as err:
        make_policy("greedy")
    assert "on-demand" in str(err.value)


def test_registry_unknown_option() -> None:
    with pytest.raises(InputError) as err:
        make_policy("uniform-progress", hysterisis=3.0)
    assert "hysteresis_cold_starts" in str(err.value)
    with pytest.raises(InputError):
        make_policy("on-demand", name="x")
