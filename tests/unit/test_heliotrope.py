"""Table-driven tests of the `heliotrope` policy, in the baselines' tiny world
(tests/unit/test_baselines.py: offers 0/1 aws us-east-1 on-demand/spot, 2/3 aws us-west-2,
4/5 gcp europe-west4; on-demand 40/32/36 $/h, spot 10/8/12 $/h; one 8-GPU job of 64
reference GPU-hours, 8 h of work on A100s, deadline 32 h after T0)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import numpy as np
import pytest

from orchestrator.model import CostSettings, Market, Phase
from policies.base import Snapshot
from policies.heliotrope import Heliotrope
from tests.unit.test_baselines import KEEP, PAUSE, Expected, World, check, decide, job, offer

H100_EAST_SPOT = offer(
    "aws", "us-east-1", "PJM", Market.SPOT, gpu="H100", instance_type="p5.48xlarge"
)  # offer 6 where added

# The rows pin the policy's knobs, so they test its mechanics, not the tuned defaults.
POLICY = dict(pressure_exponent=2.0, value_floor=0.1, hysteresis=0.05, lifetime_prior_h=6.0)


def helio() -> Heliotrope:
    return Heliotrope(**POLICY)  # type: ignore[arg-type]


ROWS: list[tuple[str, World, Expected]] = [
    ("plenty of slack: the cheapest spot", World(), 3),
    ("cheapest spot full: the next cheapest", World(spot_capacity={3: 0.0}), 1),
    ("little slack: the cheapest on-demand that finishes in time", World(now_h=32 - 8.6), 2),
    (
        "on the cheapest on-demand under pressure: stays",
        World(now_h=32 - 8.6, phase=Phase.RUNNING, offer=2),
        KEEP,
    ),
    (
        "only dear spot now, cheap spot priced but full: wait for it",
        World(usd_per_hour={1: 10.0, 3: 30.0, 5: 30.0}, spot_capacity={1: 0.0}),
        KEEP,
    ),
    (
        "running on spot, a slightly cheaper one elsewhere: stay (move costs more than it saves)",
        World(phase=Phase.RUNNING, offer=1, usd_per_hour={1: 8.2}),
        KEEP,
    ),
    (
        "running on spot, one 12 % cheaper elsewhere: stay (the gain left after the move's "
        "egress and cold start is under 5 % of what it pays an hour)",
        World(phase=Phase.RUNNING, offer=1, usd_per_hour={1: 8.0, 3: 7.0}),
        KEEP,
    ),
    (
        "running on spot, a much cheaper one elsewhere: move",
        World(phase=Phase.RUNNING, offer=1, usd_per_hour={3: 2.0}),
        3,
    ),
    (
        "running on on-demand with lots of slack and cheap spot: move to spot",
        World(phase=Phase.RUNNING, offer=0),
        3,
    ),
    (
        "running where the price went unknown (stale): hold, do not move on it",
        World(phase=Phase.RUNNING, offer=1, usd_per_hour={1: float("nan"), 3: 2.0}),
        KEEP,
    ),
    (
        "no allowed GPU anywhere: nothing to do",
        World(jobs=[job(gpu_types=frozenset({"L4"}))]),
        KEEP,
    ),
    (
        "running on spot that became dear, slack left: pause rather than pay",
        World(phase=Phase.RUNNING, offer=1, usd_per_hour={1: 39.0}, spot_capacity={3: 0.0, 5: 0.0}),
        PAUSE,
    ),
    (
        "running where progress is worth a little less than it costs: stay (a pause throws "
        "away the start-up paid, and another one is paid to come back)",
        World(
            phase=Phase.RUNNING, offer=1, usd_per_hour={1: 18.0, 5: 14.0}, spot_capacity={3: 0.0}
        ),
        KEEP,
    ),
    (
        "running where progress is worth less than half of what it costs: pause",
        World(
            phase=Phase.RUNNING, offer=1, usd_per_hour={1: 26.0, 5: 14.0}, spot_capacity={3: 0.0}
        ),
        PAUSE,
    ),
]


@pytest.mark.parametrize(("situation", "world", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_heliotrope(situation: str, world: World, expected: Expected) -> None:
    snap = world.snapshot()
    # A running job's checkpoint lies where it runs (the world factory leaves it at -1).
    fleet = dataclasses.replace(snap.fleet, checkpoint_offer=np.array([world.offer]))
    got, reason = _decide(dataclasses.replace(snap, fleet=fleet))
    assert got == expected, f"{situation}: {reason}"


def _decide(snapshot: Snapshot) -> tuple[Expected, str]:
    decision = helio()(snapshot)
    intent = decision.intents.get(0)
    if intent is None:
        return KEEP, ""
    assert intent.reason and any(ch.isdigit() for ch in intent.reason)
    return (PAUSE if intent.offer is None else intent.offer), intent.reason


def test_two_jobs_one_last_slot_least_slack_first() -> None:
    tight = job(id="tight", deadline=job().deadline - timedelta(hours=12))
    loose = job(id="loose")
    world = World(jobs=[loose, tight], spot_capacity={3: 1.0}, phase=Phase.WAITING, offer=-1)
    decision = helio()(world.snapshot())
    assert decision.intents[1].offer == 3  # the tighter job gets the last cheap slot
    assert decision.intents[0].offer == 1  # the other takes the next cheapest


def test_carbon_price_moves_the_choice_to_the_cleaner_grid() -> None:
    world = World(usd_per_hour={1: 10.0, 3: 10.0, 5: 10.0})
    plain = helio()(world.snapshot()).intents[0].offer
    priced = dataclasses.replace(
        world.snapshot(), settings=CostSettings(carbon_usd_per_tonne=1000.0)
    )
    assert plain == 1  # equal prices: the first
    assert helio()(priced).intents[0].offer == 5  # NL, 200 g/kWh, the cleanest


def test_faster_gpu_wins_on_utility_unless_it_breaks_the_budget() -> None:
    world = World(
        extra_offers=[H100_EAST_SPOT], usd_per_hour={6: 25.0, 1: 9.0, 3: 9.5, 5: 9.5}, now_h=14.0
    )
    assert helio()(world.snapshot()).intents[0].offer == 6  # 20 GPU-h/h at 25 $/h
    capped = dataclasses.replace(world, jobs=[job(budget_usd=75.0)])
    assert helio()(capped.snapshot()).intents[0].offer == 1  # H100 would cost 80 to finish


def test_reasons_carry_numbers() -> None:
    check(helio(), World(), 3)
    assert decide(helio(), World(now_h=32 - 8.6))[1].startswith("safety net")


def test_tuned_defaults_wait_for_the_cheapest_spot_when_slack_is_plenty() -> None:
    """With the defaults (pressure exponent 8), a job with 24 h left for 8 h of work does not
    settle for the second-cheapest spot; under pressure it takes it."""
    full = World(spot_capacity={3: 0.0})
    assert Heliotrope()(full.snapshot()).intents.get(0) is None
    pressed = World(spot_capacity={3: 0.0}, now_h=32 - 11.0)
    assert Heliotrope()(pressed.snapshot()).intents[0].offer == 1


H100_EAST_ON_DEMAND = offer(
    "aws", "us-east-1", "PJM", Market.ON_DEMAND, gpu="H100", instance_type="p5.48xlarge"
)  # offer 6 where added
L4_EAST_SPOT = offer(
    "aws", "us-east-1", "PJM", Market.SPOT, gpu="L4", instance_type="g6.48xlarge"
)  # offer 6 where added


def test_safety_net_falls_back_on_a_fairly_priced_on_demand_not_the_fastest() -> None:
    """A 2.5x faster on-demand machine at 10x the price per unit of progress is not the
    fallback the net measures slack on: with 8.6 h left for 8 h on A100s the net fires and
    takes the cheapest on-demand A100 (offer 2), though the H100 would still leave hours."""
    world = World(extra_offers=[H100_EAST_ON_DEMAND], usd_per_hour={6: 1000.0}, now_h=32 - 8.6)
    target, reason = decide(Heliotrope(), world)
    assert target == 2 and reason.startswith("safety net")
    # when the dear machine is the only way to finish in time, the net still takes it
    late = dataclasses.replace(world, now_h=32 - 6.0)
    assert decide(Heliotrope(), late)[0] == 6


def test_deadline_pressure_counts_at_the_speed_of_the_cheapest_spot() -> None:
    """The cheapest spot per unit of progress is a slow L4. With 20 h left for 8 h of A100
    work the job has slack on A100s but none on L4s: it must not idle waiting for spot
    bargains; it runs on the next cheapest spot A100 (offer 1, full at 3)."""
    world = World(
        extra_offers=[L4_EAST_SPOT],
        usd_per_hour={6: 1.0},
        spot_capacity={3: 0.0, 6: 0.0},
        now_h=32 - 20.0,
        jobs=[job(gpu_types=frozenset({"A100-80GB", "L4"}))],
    )
    assert decide(Heliotrope(), world)[0] == 1


# --- the fast paths are the plain rules ---------------------------------------------------


def _serve_one_by_one(
    h: Heliotrope,
    queue: np.ndarray,
    utility: np.ndarray,
    inst: np.ndarray,
    spot: np.ndarray,
    capacity: np.ndarray,
    holding: np.ndarray,
    cur: np.ndarray,
    priced: np.ndarray,
    wait_u: np.ndarray | None = None,
    paying: np.ndarray | None = None,
) -> list[tuple[int, int | None]]:
    """The fleet-capacity rule as first written: one job at a time, least slack first (an
    idle job launches only where that beats waiting, `wait_u`, when given; a running job
    moves and pauses only past the margins on what it pays, `paying`, when given)."""
    out: list[tuple[int, int | None]] = []
    free = capacity.copy()
    for i in queue:
        row = utility[i].copy()
        row[spot & (free < inst[i])] = -np.inf
        if holding[i]:
            row[cur[i]] = utility[i, cur[i]]
        best = int(np.argmax(row))
        best_u = row[best]
        if holding[i]:
            cur_u = utility[i, cur[i]]
            stake = 0.0 if paying is None else paying[i]
            with np.errstate(invalid="ignore"):  # -inf + inf: not clearly better, not worse
                worse = best_u <= cur_u + h.hysteresis * abs(cur_u) + 1e-9 + h.move_margin * stake
            if not priced[cur[i]] or best == cur[i] or worse:
                continue
            if best_u <= 0.0:
                if cur_u < -h.pause_loss * stake:
                    out.append((int(i), None))
                continue
        elif (
            best_u <= 0.0
            or not np.isfinite(best_u)
            or (wait_u is not None and not best_u > wait_u[i])
        ):
            continue
        if spot[best]:
            free[best] -= inst[i, best]
        out.append((int(i), best))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_serving_the_queue_at_once_equals_one_job_at_a_time(seed: int) -> None:
    """Many jobs after few spot slots (1 or 2 instances each): the fleet rule, which serves
    the whole queue and re-chooses only the jobs whose slot ran out, makes exactly the
    choices of the one-by-one rule, in the same order; also with waiting valued, with a
    loss a running job bears before it pauses, and with the utility already masked by the
    slots, as the decision passes it."""
    rng = np.random.default_rng(seed)
    n, n_o = int(rng.integers(1, 60)), int(rng.integers(2, 12))
    spot = rng.random(n_o) < 0.6
    capacity = np.where(spot, rng.integers(0, 4, n_o).astype(float), np.inf)
    utility = rng.normal(1.0, 2.0, (n, n_o))
    utility[rng.random((n, n_o)) < 0.2] = -np.inf
    inst = rng.integers(1, 3, (n, n_o))
    holding = rng.random(n) < 0.4
    cur = rng.integers(0, n_o, n)
    priced = rng.random(n_o) < 0.9
    queue = rng.permutation(n)
    h = Heliotrope()
    args = (queue, utility, inst, spot, capacity, holding, cur, priced)
    want = _serve_one_by_one(h, *args)
    assert want and h._serve(*args) == want
    wait_u = np.where(rng.random(n) < 0.5, rng.normal(1.0, 2.0, n), -np.inf)
    assert h._serve(*args, wait_u) == _serve_one_by_one(h, *args, wait_u)
    paying = rng.uniform(0.0, 6.0, n)
    assert h._serve(*args, None, paying) == _serve_one_by_one(h, *args, None, paying)
    masked = np.where(spot[None, :] & (capacity[None, :] < inst), -np.inf, utility)
    rows = np.flatnonzero(holding)
    masked[rows, cur[rows]] = utility[rows, cur[rows]]
    args_m = (queue, masked, inst, spot, capacity, holding, cur, priced)
    with np.errstate(invalid="ignore"):  # as the decision calls it
        served = h._serve(*args_m, masked=True)
    assert served == _serve_one_by_one(h, *args_m) == want


def test_lifetime_tracker_carries_the_block_estimate_from_tick_to_tick() -> None:
    from orchestrator.signals.history import SignalHistory
    from policies.spot_lifetime import LifetimeTracker, expected_lifetime_h

    rng = np.random.default_rng(3)
    n_t, n_o, tick_h = 400, 5, 1 / 6
    capacity = (rng.random((n_t, n_o)) < 0.7).astype(float)
    capacity[rng.random((n_t, n_o)) < 0.05] = np.nan
    capacity[:, 0] = np.inf  # on-demand: always there

    class Grid:  # the rows a SignalHistory reads
        spot_capacity = capacity

    grid = Grid()
    tracker = LifetimeTracker(tick_h, prior_hours=2.0, halflife_h=6.0, lookback=n_t)
    for k in [*range(250), 260, 261, 262, 261]:  # a skipped tick and a step back: from rows
        got = tracker(SignalHistory(grid, k))  # type: ignore[arg-type]
        want = expected_lifetime_h(capacity[: k + 1], tick_h, prior_hours=2.0, halflife_h=6.0)
        assert got == pytest.approx(want, rel=1e-9)


# --- learned survival: young runs die young, a job may wait for a return ---------------------


def _with_spot_history(snapshot: Snapshot, spot_rows: dict[int, list[float]]) -> Snapshot:
    """`snapshot` with a spot-capacity history per offer (oldest first, the last row now);
    offers not named are always available (on-demand: inf)."""
    from orchestrator.signals.grid import SignalGrid
    from orchestrator.signals.history import SignalHistory

    n_rows = len(next(iter(spot_rows.values())))
    capacity = np.tile(snapshot.spot_capacity, (n_rows, 1))
    for o, rows in spot_rows.items():
        capacity[:, o] = rows
    n_o = len(snapshot.offers)
    grid = SignalGrid(
        start=snapshot.now - timedelta(hours=snapshot.tick_h * (n_rows - 1)),
        tick_s=round(snapshot.tick_h * 3600),
        offers=tuple(snapshot.offers),
        usd_per_hour=np.tile(snapshot.usd_per_hour, (n_rows, 1)),
        spot_capacity=capacity,
        carbon_g_per_kwh=np.tile(snapshot.carbon_g_per_kwh, (n_rows, 1)),
        carbon_marginal_g_per_kwh=np.tile(snapshot.carbon_marginal_g_per_kwh, (n_rows, 1)),
        carbon_hourly_known=np.ones((n_rows, n_o), dtype=np.bool_),
        curtailing=np.zeros((n_rows, n_o), dtype=np.bool_),
    )
    return dataclasses.replace(
        snapshot, spot_capacity=capacity[-1], history=SignalHistory(grid, n_rows - 1)
    )


def _target(policy: Heliotrope, snapshot: Snapshot) -> Expected:
    intent = policy(snapshot).intents.get(0)
    return KEEP if intent is None else (PAUSE if intent.offer is None else intent.offer)


# Offer 3 (the cheapest spot, 8 $/h) has long runs, but after each outage it flickers: it is
# back this tick after two runs of one tick. Offer 1 (10 $/h) has been up all along.
FLICKER = (
    [5.0] * 30
    + [0.0, 0.0, 5.0, 0.0, 0.0, 5.0, 0.0, 0.0]
    + [5.0] * 30
    + [0.0, 0.0, 5.0, 0.0, 0.0, 5.0]
)
# The same zone flickering on and on: eight runs of one tick since its long run ended.
FLICKER_ON = [5.0] * 40 + [0.0, 0.0, 5.0] * 8


def test_a_zone_just_back_from_flickering_is_a_young_run() -> None:
    """Offer 3 is back this tick: a young run, and half its runs died young. Its stay,
    over all its runs, is short: the steady offer wins. With one hazard per offer, the cheap
    one does. With `mature_stays` (off by default), a launch that lives stays as long as
    the runs that outlived their youth (30 ticks): at 8 $/h against 10 the try is worth a
    cold start, unless nearly every run dies young."""
    snap = _with_spot_history(World().snapshot(), {3: FLICKER})
    constant = Heliotrope(**POLICY, young_run_h=0.0)  # type: ignore[arg-type]
    assert helio().young_run_h == 0.5  # young runs are the default
    assert _target(helio(), snap) == 1  # the steady one: the young run likely dies
    assert _target(constant, snap) == 3  # one hazard per offer: the cheap one
    mature = Heliotrope(**POLICY, mature_stays=True)  # type: ignore[arg-type]
    assert _target(mature, snap) == 3
    flickering = _with_spot_history(World().snapshot(), {3: FLICKER_ON})
    assert _target(mature, flickering) == 1


def test_a_run_that_outlived_its_youth_stays_as_long_as_such_runs_did() -> None:
    """`mature_h` leaves the young deaths to the young-death share: over FLICKER's rows
    (two runs of 30 ticks and three of one tick ended, one of one tick now) it is the long
    runs' stay, well above the lifetime over all runs."""
    from orchestrator.signals.history import SignalHistory
    from policies.spot_lifetime import LifetimeTracker

    capacity = np.array(FLICKER)[:, None]

    class Grid:
        spot_capacity = capacity

    tracker = LifetimeTracker(0.25, prior_hours=2.0, halflife_h=1e9, lookback=1000, young_h=0.5)
    overall = tracker(SignalHistory(Grid(), len(FLICKER) - 1))  # type: ignore[arg-type]
    # Young: up to 2 ticks (0.5 h). Uptime past youth: the two long runs' ticks after their
    # third, 27 each, 0.25 h a tick; their two ends are the ends past youth; the three
    # short runs' ends are young ones.
    assert tracker.mature_h[0] == pytest.approx((2 * 27 * 0.25 + 2.0) / (2 + 1))
    assert overall[0] == pytest.approx(((30 + 1 + 1 + 30 + 1 + 1) * 0.25 + 2.0) / (5 + 1))
    assert tracker.young_death[0] == pytest.approx((3 + 0.5) / (5 + 1))  # 5 returns, now's too


def test_lifetime_tracker_learns_young_deaths_and_outages() -> None:
    from orchestrator.signals.history import SignalHistory
    from policies.spot_lifetime import LifetimeTracker

    capacity = np.array(FLICKER)[:, None]

    class Grid:
        spot_capacity = capacity

    tracker = LifetimeTracker(
        0.25, prior_hours=2.0, halflife_h=1e9, lookback=1000, outage_prior_h=1.0, young_h=0.5
    )
    tracker(SignalHistory(Grid(), len(FLICKER) - 1))  # type: ignore[arg-type]
    # 5 returns, 3 of them young deaths (one tick each); outages of 2 ticks (0.5 h), 5 of them
    assert tracker.young_death[0] == pytest.approx((3 + 0.5) / (5 + 1))
    assert tracker.outage_h[0] == pytest.approx((5 * 0.5 + 1.0) / (5 + 1))
    assert tracker.age_h[0] == pytest.approx(0.25)


def test_an_idle_job_waits_for_the_cheap_zone_that_comes_back_soon() -> None:
    """Offer 3 (8 $/h) is down now; its outages last one tick. With 2 h of slack and the
    waiting option the job waits for it rather than launch at once on offer 1 (10 $/h);
    without (the default) it launches on offer 1. One hazard per offer (no young runs: a
    zone back from an outage would be a young run, with its own chance of dying young)."""
    outages = ([5.0] * 20 + [0.0]) * 3 + [5.0] * 20 + [0.0]
    snap = _with_spot_history(World(now_h=32 - 10.5).snapshot(), {3: outages})
    assert _target(Heliotrope(wait_for_spot=True, young_run_h=0.0), snap) == KEEP
    assert _target(Heliotrope(young_run_h=0.0), snap) == 1  # waiting is not an option


def _preempted(world: World, spot_rows: dict[int, list[float]], checkpoint: int) -> Snapshot:
    """An idle job with progress whose checkpoint lies at offer `checkpoint` (it was
    preempted)."""
    snap = _with_spot_history(world.snapshot(), spot_rows)
    fleet = dataclasses.replace(snap.fleet, checkpoint_offer=np.array([checkpoint]))
    return dataclasses.replace(snap, fleet=fleet)


# Offer 3 (us-west-2 spot, 8 $/h, the cheapest) is down now after runs of 20 ticks and
# outages of one; offer 1 (us-east-1 spot, 10 $/h) is up. 6 h of work are left.
BACK_SOON = ([5.0] * 20 + [0.0]) * 6 + [5.0] * 20 + [0.0]


@pytest.mark.parametrize(
    ("hours_left", "checkpoint", "size_gb", "expected"),
    [
        (8.0, 3, 10.0, KEEP),  # waits where its checkpoint lies: there is time for the outage
        (7.6, 3, 10.0, 1),  # no time to wait out the expected outage too: moves
        (8.0, 1, 10.0, 1),  # its checkpoint lies in offer 1's region: nothing to wait for
        # Time to wait and finish at offer 3, but, should it stay down, not to copy 300 GB
        # to offer 1 and finish there after the wait: moves now.
        (7.8, 3, 300.0, 1),
        (7.8, 3, 10.0, KEEP),  # a small copy leaves that time
    ],
)
def test_an_idle_job_waits_where_its_checkpoint_lies_while_the_wait_fits(
    hours_left: float, checkpoint: int, size_gb: float, expected: Expected
) -> None:
    """Offer 1 would cost the egress and 2 $/h more to the end. Offer 3's outages are
    expected to last 0.70 h (one tick each, and the 1 h prior): with it, the cold start
    (0.5 h), 6 h of work and the net's margin (two ticks, 0.5 h) take 7.7 h."""
    world = World(now_h=32 - hours_left, progress=16.0, jobs=[job(checkpoint_size_gb=size_gb)])
    snap = _preempted(world, {3: BACK_SOON}, checkpoint)
    assert _target(Heliotrope(), snap) == expected
    # Without the rule the utility per hour relaunches in the dearer zone at once.
    assert _target(Heliotrope(wait_at_checkpoint=False), snap) == 1


# Offer 3's outages: two of 12 ticks (3 h), then three of 2 ticks; it went down this tick.
MOSTLY_SHORT = ([5.0] * 20 + [0.0] * 12) * 2 + ([5.0] * 20 + [0.0] * 2) * 3 + [5.0] * 20 + [0.0]


@pytest.mark.parametrize(("odds", "expected"), [(0.8, 1), (0.5, KEEP), (0.0, KEEP)])
def test_the_wait_must_fit_the_outage_at_the_rules_odds(odds: float, expected: Expected) -> None:
    """On average (recent outages weigh more) offer 3's outage is over in 0.95 h, within
    the 1 h the job can spare (8 h left; cold start, 6 h of work and the net's margin take
    7). But of its outages that outlasted one tick, two in five lasted 11 ticks more
    (2.75 h): at the default odds (0.8) the wait does not fit, and the job moves its
    checkpoint; at even odds (1 tick more), or on average only (0), it waits."""
    assert Heliotrope().wait_odds == 0.8
    world = World(now_h=32 - 8.0, progress=16.0, jobs=[job(checkpoint_size_gb=10.0)])
    snap = _preempted(world, {3: MOSTLY_SHORT}, checkpoint=3)
    assert _target(Heliotrope(wait_odds=odds), snap) == expected


@pytest.mark.parametrize("option", ["wait_odds=1.5", "wait_odds=-0.1", "wait_pool=-1"])
def test_odds_outside_zero_to_one_are_refused_by_name(option: str) -> None:
    from orchestrator.errors import InputError
    from policies.registry import make_policy

    field = option.partition("=")[0]
    for name in ("heliotrope", "heliotrope-lookahead"):
        with pytest.raises(InputError, match=field):
            make_policy(f"{name}|{option}")


def test_a_cheapest_offer_full_of_other_jobs_is_not_waited_for() -> None:
    """Offer 3 is up, but other jobs hold all its slots: no outage will end that, so the
    job moves its checkpoint to offer 1 as without the rule."""
    world = World(now_h=32 - 8.0, progress=16.0)
    up_now = [*BACK_SOON[:-1], 5.0]
    snap = _preempted(world, {3: up_now}, checkpoint=3)
    full = np.where(np.arange(len(snap.offers)) == 3, 0.0, snap.spot_capacity)
    snap = dataclasses.replace(snap, spot_capacity=full)
    assert _target(Heliotrope(), snap) == 1


def test_a_jobs_own_carbon_price_moves_only_that_job() -> None:
    """Two identical jobs; one says `carbon_usd_per_tonne: 50000` in the jobs file (the
    fleet's price is 0). Only that one pays for the cleaner, dearer zone."""
    from orchestrator.jobs import parse_jobs
    from orchestrator.loop import LoopOptions
    from orchestrator.replay.runner import build_grid, run_policy
    from policies.heliotrope import Heliotrope
    from tests.conftest import T0, tiny_trace

    entry = {
        "work_gpu_hours": 20.0,
        "gpus": 1,
        "gpu_types": ["V100", "A100-80GB"],
        "throughput": {"V100": 1.0, "A100-80GB": 1.0},
        "start_offset_h": 0,
        "deadline_h": 40,
        "home_region": "us-east-1",
        "checkpoint_size_gb": 0.0,
    }
    jobs = parse_jobs(
        {
            "jobs": [
                {"name": "plain", **entry},
                {"name": "green", "carbon_usd_per_tonne": 50000, **entry},
            ]
        },
        trace_start=T0,
    )
    assert jobs[1].carbon_usd_per_tonne == 50000 and jobs[0].carbon_usd_per_tonne is None
    grid = build_grid(tiny_trace(), jobs, 3600, 0)
    run = run_policy(Heliotrope(), jobs, grid, options=LoopOptions(cluster="t"))
    first = {e.job_id: e.offer_id for e in reversed(run.events) if e.kind.value == "launched"}
    assert first["plain"].startswith("aws:")  # the cheap zone (PJM, 400 g/kWh)
    assert first["green"].startswith("gcp:")  # NL, 300 g/kWh, at its own carbon price


@pytest.mark.parametrize("left_gpu_h", [64.0, 8.0, 2.0])
def test_a_job_with_little_work_left_and_all_its_slack_still_launches_on_spot(
    left_gpu_h: float,
) -> None:
    """The value of progress starts at what finishing costs on the cheapest spot offer,
    its cold start included: with 0.25 h of work left (2 GPU-h on 8 A100s) and 24 h of
    slack, a 0.5 h cold start must not keep the job idle until the safety net puts it on
    on-demand (the demo's jobs idled 22 h that way and paid on-demand)."""
    world = World(progress=64.0 - left_gpu_h)
    assert decide(Heliotrope(), world)[0] == 3  # the cheapest spot, at once


@pytest.mark.parametrize("left_gpu_h", [8.0, 2.0])
def test_little_work_left_launches_on_spot_beside_a_gpu_the_job_may_not_use(
    left_gpu_h: float,
) -> None:
    """The same with an H100 spot offer in the world that the job does not allow: that
    offer's cost to finish is no number (no progress there), and it must not hide the
    cheapest allowed spot's (carbon-year's jobs allow two or three of the four GPU types;
    with this hidden they idled at the end of their work until the safety net paid
    on-demand)."""
    only_a100 = job(gpu_types=frozenset({"A100-80GB"}))
    world = World(jobs=[only_a100], extra_offers=[H100_EAST_SPOT], progress=64.0 - left_gpu_h)
    assert decide(Heliotrope(), world)[0] == 3  # the cheapest allowed spot, at once


def test_late_on_on_demand_it_does_not_move_to_an_equally_fast_cheaper_one() -> None:
    """8 h of work left on eight A100s on demand (NL, 36 $/h) with 7 h to the deadline: late
    anyway. The cheaper on-demand A100s in us-west-2 (32 $/h) would finish later still, by
    their cold start: the safety net keeps the job where it runs."""
    world = World(now_h=32 - 7.0, phase=Phase.RUNNING, offer=4)
    snap = world.snapshot()
    fleet = dataclasses.replace(snap.fleet, checkpoint_offer=np.array([4]))
    got, reason = _decide(dataclasses.replace(snap, fleet=fleet))
    assert got == KEEP, reason


def test_a_policy_that_has_decided_before_decides_as_a_fresh_one() -> None:
    """Its caches (the active jobs, the prices, the placements) follow every change: one
    policy fed a sequence of snapshots of the same world decides as a new policy does on
    each, to the reason's last digit."""
    from orchestrator.model import FleetState
    from tests.conftest import T0

    rng = np.random.default_rng(5)
    specs = [
        job(
            id=f"j{i}",
            gpus=g,
            work_gpu_hours=w,
            deadline=T0 + timedelta(hours=h),
            checkpoint_size_gb=500.0,
        )
        for i, (g, w, h) in enumerate([(8, 64.0, 32), (1, 8.0, 40), (8, 40.0, 12), (1, 20.0, 60)])
    ]
    base = World(jobs=specs).snapshot()
    n_j, n_o = len(base.jobs), len(base.offers)
    spot = np.array([o.market is Market.SPOT for o in base.offers])
    kept = Heliotrope()
    seen = set()
    for step in range(300):
        price = base.usd_per_hour.copy()
        if step % 3:  # spot prices move more often than on-demand ones
            price[spot] *= rng.uniform(0.5, 2.0, spot.sum())
        if step % 7 == 0:
            price[~spot] *= rng.uniform(0.8, 1.2, (~spot).sum())
        capacity = np.where(spot, rng.integers(0, 3, n_o).astype(float), np.inf)
        fleet = FleetState.empty(n_j)
        if step % 10 == 0:  # the same jobs active for a while, their placements moving
            phase = rng.choice([int(p) for p in Phase], n_j) if step % 20 else Phase.RUNNING
        fleet.phase[:] = phase
        running = fleet.phase >= Phase.STARTING
        placed = running & (fleet.phase != Phase.DONE)
        fleet.offer[:] = np.where(placed, rng.integers(0, n_o, n_j), -1)
        fleet.checkpoint_offer[:] = rng.integers(-1, n_o, n_j)
        fleet.progress_gpu_h[:] = rng.uniform(0, 60, n_j) if step % 2 else 0.0
        snap = dataclasses.replace(
            base,
            now_s=base.now_s + 600.0 * (step % 11),
            usd_per_hour=price,
            spot_capacity=capacity,
            fleet=fleet,
        )
        got = kept(snap)
        assert repr(got) == repr(Heliotrope()(snap)), step
        seen.add(bool(got.intents))
    assert seen == {True, False}


@pytest.mark.timeout(60)
def test_a_spot_offer_holding_more_than_its_reported_capacity_does_not_stall_the_decision() -> None:
    """Free spot slots are the reported capacity minus what the fleet holds (the loop's
    snapshot), so they go negative when a signal reports fewer slots than Heliotrope's jobs
    hold (live: polled capacity falls, the cloud reclaims nothing yet). The decision must
    still come, no job is sent to the offer with no free slot, and the one free slot
    elsewhere is taken once (it looped forever: the serving read a negative count as a
    slot taken twice)."""
    jobs = [job(id="j0"), job(id="j1")]
    world = World(
        jobs=jobs,
        phase=[Phase.RUNNING, Phase.WAITING],
        offer=[1, -1],
        spot_capacity={1: -7.0, 3: 1.0},
    )
    decision = Heliotrope()(world.snapshot())
    targets = [i.offer for i in decision.intents.values()]
    assert 1 not in targets
    assert targets.count(3) == 1  # one free slot there: one job takes it


def test_work_a_preemption_takes_back_counts_in_the_deadline_pressure() -> None:
    """The cheapest spot offer (3) is down now and its runs last about an hour. With 13 h
    left for 8 h of work a job that checkpoints continuously still waits for it; one that
    checkpoints hourly loses half an hour of work a preemption, about one an hour there, so
    it has less slack than it seems and takes the next cheapest spot (offer 1) now. Without
    a history (no lifetime learned) the two are the same."""
    runs = ([5.0] * 4 + [0.0] * 2) * 6 + [5.0] * 4 + [0.0]
    world = World(spot_capacity={3: 0.0}, now_h=32 - 13.0)
    hourly = World(spot_capacity={3: 0.0}, now_h=32 - 13.0, jobs=[job(checkpoint_interval_h=1.0)])
    assert _target(Heliotrope(), _with_spot_history(world.snapshot(), {3: runs})) == KEEP
    assert _target(Heliotrope(), _with_spot_history(hourly.snapshot(), {3: runs})) == 1
    off = Heliotrope(preemption_loss=False)
    assert _target(off, _with_spot_history(hourly.snapshot(), {3: runs})) == KEEP
    assert _target(Heliotrope(), hourly.snapshot()) == _target(Heliotrope(), world.snapshot())


@pytest.mark.parametrize(("now_h", "with_relative_margin"), [(8.0, 3), (22.0, KEEP)])
def test_a_running_job_moves_to_a_spot_offer_15_percent_cheaper_also_under_pressure(
    now_h: float, with_relative_margin: Expected
) -> None:
    """Running on offer 1 (10 $/h), offer 3 (same GPUs) at 8.5 $/h, both up for 20 h: worth
    the move's cold start and egress with lots of slack (8 h in) and near the deadline (22 h
    in, 10 h left for 8 h of work), where the value of progress is high. A hysteresis
    relative to the utility (0.1, the default until it was measured at 0) grows with that
    value and keeps the job where it pays 15 % more; 10 % cheaper (9 $/h) is not worth it."""
    history = {1: [5.0] * 80, 3: [5.0] * 80}

    def target(price: float, policy: Heliotrope) -> Expected:
        world = World(now_h=now_h, phase=Phase.RUNNING, offer=1, usd_per_hour={3: price})
        return _target(policy, _with_spot_history(world.snapshot(), history))

    assert Heliotrope().hysteresis == 0.0
    assert target(8.5, Heliotrope()) == 3
    assert target(9.0, Heliotrope()) == KEEP
    assert target(8.5, Heliotrope(hysteresis=0.1)) == with_relative_margin
