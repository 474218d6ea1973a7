"""The online optimum and the clairvoyant one on a memoryless spot hazard
(orchestrator/replay/hazard_bound.py), against hand-computed schedules and exact
enumeration of every availability path."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from orchestrator.replay.hazard_bound import (
    Hazard,
    HazardJob,
    clairvoyant_costs,
    hazard_bound,
    online_optimum,
    sample_paths,
)

HAZARD = Hazard(loss_per_hour=0.10, return_per_hour=0.15)


def job(
    prices: list[float],
    *,
    work: float = 2.0,
    ticks: int = 12,
    cold: float = 0.2,
    egress: float = 0.0,
    od: float = 10.0,
    checkpoint_h: float = 0.0,
) -> HazardJob:
    k = len(prices)
    return HazardJob(
        spot_usd_per_h=np.array(prices, dtype=float),
        spot_rate=np.ones(k),
        egress_usd=np.full((k, k), egress) - egress * np.eye(k),
        transfer_h=np.zeros((k, k)),
        od_usd_per_h=od,
        od_rate=1.0,
        work=work,
        ticks=ticks,
        tick_h=0.5,
        cold_start_h=cold,
        checkpoint_h=checkpoint_h,
    )


def exact_clairvoyant_mean(j: HazardJob) -> float:
    """The clairvoyant optimum's exact expectation for a one-offer job: every availability
    path over its ticks, weighted by its probability under `HAZARD`."""
    lose, back = HAZARD.step(j.tick_h)
    paths = np.array(list(itertools.product([False, True], repeat=j.ticks + 1)), dtype=bool)
    prob = np.where(paths[:, 0], HAZARD.up_share, 1.0 - HAZARD.up_share)
    for t in range(j.ticks):
        a, b = paths[:, t], paths[:, t + 1]
        prob = prob * np.where(a, np.where(b, 1.0 - lose, lose), np.where(b, back, 1.0 - back))
    assert prob.sum() == pytest.approx(1.0)
    return float(prob @ clairvoyant_costs(j, paths.T[:, :, None]))


def test_with_spot_always_up_both_pay_the_cheapest_run() -> None:
    # 2 h of work: 0.3 h in the launch tick (0.2 h cold start), then 0.5 h a tick: 5 ticks
    # of 0.5 h at 2 USD/h.
    never_lost = Hazard(loss_per_hour=0.0, return_per_hour=1.0)
    j = job([2.0, 3.0])
    paths = sample_paths(never_lost, j.k, j.ticks, j.tick_h, 4, np.random.default_rng(0))
    assert online_optimum(j, never_lost) == pytest.approx(5.0)
    assert clairvoyant_costs(j, paths) == pytest.approx(np.full(4, 5.0))


def test_the_clairvoyant_waits_for_the_cheap_offer_it_knows_returns() -> None:
    # Cheap (1 USD/h) down for two ticks, dear (2 USD/h) up throughout; 1 h of work, no cold
    # start: wait two ticks, then two ticks on the cheap offer, 1 USD.
    j = job([1.0, 2.0], work=1.0, ticks=6, cold=0.0)
    up = np.ones((7, 1, 2), dtype=bool)
    up[:2, 0, 0] = False
    assert clairvoyant_costs(j, up)[0] == pytest.approx(1.0)
    # Only on-demand (10 USD/h) left: two ticks, 10 USD; and no way to finish in time at all.
    assert clairvoyant_costs(j, np.zeros((7, 1, 2), dtype=bool))[0] == pytest.approx(10.0)
    short = job([1.0, 2.0], work=1.0, ticks=1, cold=0.0)
    assert clairvoyant_costs(short, np.ones((2, 1, 2), dtype=bool))[0] > 1e9


def test_egress_is_paid_where_the_checkpoint_moves() -> None:
    # Two equal offers, 3 USD egress between them, 1 h of work in 2 ticks, no cold start:
    # offer 0 is up in the first tick only, offer 1 in the second only, so the job runs a
    # tick on each and pays the move: 0.5 + 3 + 0.5 (on-demand, 50 USD a tick, is dearer).
    j = job([1.0, 1.0], work=1.0, ticks=2, cold=0.0, egress=3.0, od=100.0)
    up = np.zeros((3, 1, 2), dtype=bool)
    up[0, 0, 0] = True
    up[1:, 0, 1] = True
    assert clairvoyant_costs(j, up)[0] == pytest.approx(4.0)
    # With offer 1 up from the start it runs there both ticks: no move, 1 USD.
    up[0, 0, 1] = True
    assert clairvoyant_costs(j, up)[0] == pytest.approx(1.0)


def test_online_is_above_the_exact_clairvoyant_mean_and_below_on_demand() -> None:
    # Every availability path of one offer over 8 ticks, with its probability: the exact
    # expectation of the clairvoyant optimum. The online optimum cannot beat it, and never
    # pays more than on-demand alone (3 ticks: 0.3 + 0.5 + 0.5 h of 1.2 h; 1.5 h at 10 USD/h).
    j = job([1.0], work=1.2, ticks=8, od=10.0)
    exact = exact_clairvoyant_mean(j)
    online = online_optimum(j, HAZARD)
    assert exact < online < 15.0
    # The sampled mean agrees with the exact one.
    b = hazard_bound(j, HAZARD, samples=4000, seed=3)
    assert b.online_usd == pytest.approx(online)
    assert abs(b.clairvoyant_usd - exact) < 4.0 * b.clairvoyant_se_usd + 1e-9


def test_a_second_offer_helps_and_the_clairvoyant_stays_below() -> None:
    # With a second offer like the first, the online optimum pays less than with one (it
    # may always ignore it), and still more than the clairvoyant mean.
    one = online_optimum(job([1.0], work=3.0, ticks=16), HAZARD)
    two_job = job([1.0, 1.0], work=3.0, ticks=16)
    two = online_optimum(two_job, HAZARD)
    paths = sample_paths(HAZARD, 2, two_job.ticks, two_job.tick_h, 2000, np.random.default_rng(1))
    clair = float(clairvoyant_costs(two_job, paths).mean())
    assert clair < two < one


def test_a_preemption_between_checkpoints_takes_the_work_back() -> None:
    # One offer at 1 USD/h, up in ticks 0, 2 and 3 and down in tick 1; 1.5 h of work in 4
    # ticks of 0.5 h, no cold start; on-demand 10 USD/h. Checkpointing continuously, or at
    # the end of every tick (every 0.5 h), the tick run before the drop is kept: three ticks
    # on spot, 1.5 USD.
    up = np.ones((5, 1, 1), dtype=bool)
    up[1] = False
    for every in (0.0, 0.5):
        j = job([1.0], work=1.5, ticks=4, cold=0.0, checkpoint_h=every)
        assert clairvoyant_costs(j, up)[0] == pytest.approx(1.5)
    # Hourly, the first checkpoint would come at the end of tick 1: riding tick 0 into the
    # drop loses it, so a tick on on-demand it must be (5 USD) and two on spot: 6 USD.
    hourly = job([1.0], work=1.5, ticks=4, cold=0.0, checkpoint_h=1.0)
    assert clairvoyant_costs(hourly, up)[0] == pytest.approx(6.0)
    # With the drop a tick later, the checkpoint at the end of tick 1 keeps both ticks.
    later = np.ones((6, 1, 1), dtype=bool)
    later[2] = False
    longer = job([1.0], work=1.5, ticks=5, cold=0.0, checkpoint_h=1.0)
    assert clairvoyant_costs(longer, later)[0] == pytest.approx(1.5)


def test_checkpoints_cost_the_online_optimum_more_than_the_clairvoyant() -> None:
    # The small case of the exact enumeration above, with hourly checkpoints: what a
    # preemption takes back costs the policy that cannot see it coming; the clairvoyant
    # loses little, and is still below it.
    continuous = job([1.0], work=1.2, ticks=8, od=10.0)
    hourly = job([1.0], work=1.2, ticks=8, od=10.0, checkpoint_h=1.0)
    assert (
        exact_clairvoyant_mean(continuous)
        <= exact_clairvoyant_mean(hourly)
        < online_optimum(hourly, HAZARD)
    )
    assert online_optimum(hourly, HAZARD) > online_optimum(continuous, HAZARD)
    # The foresight is worth more where preemptions cost work.
    assert online_optimum(hourly, HAZARD) / exact_clairvoyant_mean(hourly) > online_optimum(
        continuous, HAZARD
    ) / exact_clairvoyant_mean(continuous)


def test_paths_must_cover_the_job() -> None:
    j = job([1.0, 2.0], ticks=6)
    with pytest.raises(ValueError, match="do not cover"):
        clairvoyant_costs(j, np.ones((3, 1, 2), dtype=bool))


def test_hazard_step_probabilities() -> None:
    lose, back = HAZARD.step(0.5)
    assert lose == pytest.approx(1 - math.exp(-0.05))
    assert back == pytest.approx(1 - math.exp(-0.075))
    assert HAZARD.up_share == pytest.approx(0.6)
