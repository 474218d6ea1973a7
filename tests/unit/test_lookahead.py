"""`heliotrope-lookahead`: heliotrope plus the exact DP on sampled futures at decision points,
in the baselines' tiny world (tests/unit/test_baselines.py: offers 0/1 aws us-east-1
on-demand/spot, 2/3 aws us-west-2, 4/5 gcp europe-west4; on-demand 40/32/36 $/h, spot
10/8/12 $/h; one 8-GPU job of 64 GPU-hours, 8 h of work, deadline 32 h after T0; 15-minute
ticks)."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.errors import InputError
from orchestrator.model import Phase
from policies.heliotrope import Heliotrope
from policies.lookahead import HeliotropeLookahead, RunModel
from policies.registry import make_policy
from tests.unit.test_baselines import KEEP, World
from tests.unit.test_heliotrope import BACK_SOON, _preempted, _target, _with_spot_history

# BACK_SOON: offer 3 (us-west-2 spot, 8 $/h) has runs of 20 ticks and outages of one tick;
# it is down now (the job was just preempted there). Offer 1 (us-east-1 spot, 10 $/h) is up.
WORLD = World(now_h=32 - 8.0, progress=16.0)  # 6 h of work left, 1.5 h of slack


def test_an_idle_job_waits_for_the_cheap_zone_that_returns_soon() -> None:
    snap = _preempted(WORLD, {3: BACK_SOON}, checkpoint=3)
    # The utility alone relaunches in the dear zone; the lookahead overrides it.
    assert _target(Heliotrope(wait_at_checkpoint=False), snap) == 1
    decision = HeliotropeLookahead()(snap)
    assert 0 not in decision.intents  # waits: every sampled outage lasts a tick
    # Heliotrope's own rule waits here too: the checkpoint lies in offer 3's region.
    assert _target(Heliotrope(), snap) == KEEP


def test_a_zone_that_stays_down_is_not_waited_for() -> None:
    """Offer 3 has been down for the last 40 ticks (10 h) and never came back in its
    history: the futures keep it down for hours, and the job relaunches in offer 1 at once."""
    stays_down = [5.0] * 120 + [0.0] * 40
    snap = _preempted(WORLD, {3: stays_down}, checkpoint=3)
    assert _target(HeliotropeLookahead(), snap) == 1


def test_the_same_snapshot_gives_the_same_votes_and_the_seed_changes_the_draws() -> None:
    # A zone whose outages last 1 or 12 ticks: the futures disagree, the votes follow the draws.
    mixed = ([5.0] * 20 + [0.0]) * 3 + ([5.0] * 20 + [0.0] * 12) * 3 + [5.0] * 20 + [0.0]
    snap = _preempted(WORLD, {3: mixed}, checkpoint=3)
    policy = HeliotropeLookahead(lookahead_samples=16)
    model = policy._run_model(snap)
    first = policy._votes(policy._futures(snap, 0, model))
    assert sum(first.values()) == 16
    assert len(first) > 1  # some futures wait, some launch
    assert policy._votes(policy._futures(snap, 0, model)) == first
    assert HeliotropeLookahead(lookahead_samples=16)(snap) == policy(snap)
    seeds = set()
    for s in range(6):
        other = HeliotropeLookahead(lookahead_samples=16, lookahead_seed=s)
        seeds.add(tuple(sorted(other._votes(other._futures(snap, 0, model)).items())))
    assert len(seeds) > 1  # the seed moves the sampled futures


def test_the_mean_rule_prices_each_first_action_on_every_future() -> None:
    """Waiting a tick for offer 3 (back next tick in every future, 8 $/h) costs less on
    average than launching now on offer 1 (10 $/h) or on-demand offer 2 (32 $/h)."""
    snap = _preempted(WORLD, {3: BACK_SOON}, checkpoint=3)
    policy = HeliotropeLookahead(lookahead_rule="mean")
    q = policy._expected(policy._futures(snap, 0, policy._run_model(snap)), [-1, 1, 2, 3])
    assert q[3] == float("inf")  # down now: no launch there
    assert q[-1] < q[1] < q[2]
    assert 0 not in policy(snap).intents  # it waits


def test_no_samples_is_heliotrope() -> None:
    snap = _preempted(WORLD, {3: BACK_SOON}, checkpoint=3)
    # The lookahead keeps heliotrope's wait where the checkpoint lies off: it decides waits.
    plain = Heliotrope(wait_at_checkpoint=False)
    assert HeliotropeLookahead(lookahead_samples=0)(snap) == plain(snap)


def test_the_safety_net_is_never_overridden() -> None:
    """Slack below two ticks: heliotrope's net goes to on-demand; the lookahead leaves it."""
    world = World(now_h=32 - 6.8, progress=16.0, usd_per_hour={1: 14.0})
    snap = _preempted(world, {3: BACK_SOON}, checkpoint=3)
    intent = HeliotropeLookahead()(snap).intents[0]
    assert intent.reason.startswith("safety net")


def test_a_job_that_never_ran_is_left_to_heliotrope() -> None:
    snap = _with_spot_history(World(usd_per_hour={1: 14.0}).snapshot(), {3: BACK_SOON})
    assert HeliotropeLookahead()(snap) == Heliotrope()(snap)


def test_run_model_learns_completed_runs_and_the_current_state() -> None:
    capacity = np.array(
        [[1, 0], [1, 0], [0, 0], [0, 3], [1, 3], [1, 3], [1, 0], [0, 0]], dtype=float
    )
    model = RunModel.learn(capacity)
    # offer 0: run 2 (maybe cut by the lookback: kept as seen), outage 2, run 3, down now
    assert model.up_runs[0].tolist() == [2, 3]
    assert model.down_runs[0].tolist() == [2]
    assert not model.up_now[0] and model.age[0] == 1
    # offer 1: outage 3, run 3, now down for 2; capacity 3 while up
    assert model.up_runs[1].tolist() == [3]
    assert model.down_runs[1].tolist() == [3]
    assert model.age[1] == 2 and model.up_capacity[1] == 3.0


def test_sampled_futures_continue_the_current_run_by_its_learned_lengths() -> None:
    # Runs of 4 ticks and outages of 2, up now for 3 ticks: the run ends after one more tick.
    rows = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0] * 4 + [1.0, 1.0, 1.0]
    model = RunModel.learn(np.array(rows)[:, None])
    rng = np.random.default_rng(0)
    future = model.sample(0, 12, rng)
    assert future.tolist() == [True, True, False, False] + [True] * 4 + [False] * 2 + [True] * 2


def test_registry_and_options() -> None:
    policy = make_policy("heliotrope-lookahead", lookahead_samples=4)
    assert isinstance(policy, HeliotropeLookahead)
    assert policy.lookahead_samples == 4
    assert policy.name == "heliotrope-lookahead"
    spec = "heliotrope-lookahead|lookahead_samples=3|lookahead_rule=mean|lookahead_quorum=0.6"
    named = make_policy(spec)
    assert isinstance(named, HeliotropeLookahead)
    assert (named.lookahead_samples, named.lookahead_rule, named.lookahead_quorum) == (
        3,
        "mean",
        0.6,
    )
    assert named.name == spec  # suite tables tell the variants apart
    assert make_policy("heliotrope|wait_for_spot=true").wait_for_spot is True  # type: ignore[attr-defined]
    with pytest.raises(InputError):
        make_policy("heliotrope-lookahead|lookahead_samples=many")
    with pytest.raises(InputError):
        make_policy("heliotrope-lookahead|nonsense=1")
    with pytest.raises(ValueError, match="lookahead_quorum"):
        HeliotropeLookahead(lookahead_quorum=1.0)


def test_a_running_job_is_not_a_decision_point() -> None:
    world = World(phase=Phase.RUNNING, offer=1, progress=16.0, usd_per_hour={3: 2.0})
    snap = _preempted(world, {3: [*BACK_SOON[:-1], 5.0]}, checkpoint=1)
    assert HeliotropeLookahead()(snap) == Heliotrope()(snap)
