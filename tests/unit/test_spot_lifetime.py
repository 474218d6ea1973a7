"""`LifetimeTracker` against the weighted sums written out run by run, tick by tick; the
outages it keeps, and the rest of an outage at given odds."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.signals.history import SignalHistory
from policies.spot_lifetime import LifetimeTracker, outage_rest_quantile


def _by_hand(
    up: list[bool], tick_h: float, halflife_h: float, young_h: float
) -> tuple[float, float, float, float, float]:
    """One offer's (lifetime, outage_h, young_death, age_h, mature_h) from its rows, oldest
    first, with priors of one run of 2 h, one outage of 1 h and one young death in two
    runs; mature_h over the hours runs stayed up past `young_h` and the ends of the runs
    that outlived it."""
    uptime = ends = downtime = returns = young = mature_up = 0.0
    age = 0
    n = len(up)
    for i, now in enumerate(up):
        w = 0.5 ** ((n - 1 - i) * tick_h / halflife_h)
        before = up[i - 1] if i > 0 else now
        was_young = age * tick_h <= young_h + 1e-9
        uptime += w * tick_h * now
        downtime += w * tick_h * (not now)
        if before and now and not was_young:
            mature_up += w * tick_h
        if before and not now:
            ends += w
            young += w * was_young
        if not before and now:
            returns += w
        age = age + 1 if now else 0
    return (
        (uptime + 2.0) / (ends + 1.0),
        (downtime + 1.0) / (returns + 1.0),
        (young + 0.5) / (returns + 1.0),
        age * tick_h,
        (mature_up + 2.0) / (ends - young + 1.0),
    )


@pytest.mark.parametrize("young_h", [0.0, 0.25, 0.5])
def test_tracker_learns_runs_outages_and_young_deaths(young_h: float) -> None:
    rng = np.random.default_rng(11)
    n_t, n_o, tick_h = 120, 4, 0.25
    # Runs of random lengths (flicker and long stays), some rows unknown (NaN: down).
    capacity = np.repeat(rng.random((n_t // 4 + 1, n_o)) < 0.6, rng.integers(1, 7), axis=0)
    capacity = capacity[:n_t].astype(float) * 3
    capacity[rng.random(capacity.shape) < 0.04] = np.nan

    class Grid:
        spot_capacity = capacity

    tracker = LifetimeTracker(
        tick_h, prior_hours=2.0, halflife_h=3.0, lookback=10_000, young_h=young_h
    )
    grid = Grid()  # one grid: the tracker steps from tick to tick on it
    for k in [*range(capacity.shape[0]), 5, 6, 40]:  # tick by tick, then back: from rows
        got = tracker(SignalHistory(grid, k))  # type: ignore[arg-type]
        for o in range(n_o):
            up = [bool(c > 0) for c in capacity[: k + 1, o]]
            life, outage, young, age, mature = _by_hand(up, tick_h, 3.0, young_h)
            assert got[o] == pytest.approx(life, rel=1e-9)
            assert tracker.outage_h[o] == pytest.approx(outage, rel=1e-9)
            assert tracker.young_death[o] == pytest.approx(young, rel=1e-9)
            assert tracker.age_h[o] == pytest.approx(age)
            assert tracker.mature_h[o] == pytest.approx(mature, rel=1e-9)


def _outages_by_hand(up: list[list[bool]]) -> list[tuple[int, int, bool]]:
    """(offer, length, ended) of every outage that began after an up row, scanned row by
    row."""
    found = []
    for o, column in enumerate(zip(*up, strict=True)):
        run, seen_up = 0, False
        for now in column:
            if now:
                if seen_up and run:
                    found.append((o, run, True))
                seen_up, run = True, 0
            else:
                run += 1
        if seen_up and run:
            found.append((o, run, False))
    return sorted(found)


@pytest.mark.parametrize("lookback", [1000, 40])
def test_tracker_keeps_the_outages_of_its_window(lookback: int) -> None:
    """Step by step and rebuilt after a jump, the tracker's outages are those of the last
    `lookback` rows (an outage under way at the first of them left out), and each offer's
    current outage is as old as its trailing down rows."""
    rng = np.random.default_rng(3)
    n_t, n_o = 300, 5
    capacity = np.repeat(rng.random((n_t // 3 + 1, n_o)) < 0.6, rng.integers(1, 9), axis=0)
    capacity = capacity[:n_t].astype(float)

    class Grid:
        spot_capacity = capacity

    tracker = LifetimeTracker(0.25, prior_hours=2.0, halflife_h=6.0, lookback=lookback)
    grid = Grid()  # one grid: the tracker steps from tick to tick on it
    for k in [*range(n_t), 120, 121, 250]:  # tick by tick, then back: from rows
        tracker(SignalHistory(grid, k))  # type: ignore[arg-type]
        rows = (capacity[max(0, k - lookback + 1) : k + 1] > 0).tolist()
        offer, length, ended = tracker.outages()
        got = sorted(zip(offer.tolist(), length.tolist(), ended.tolist(), strict=True))
        assert got == _outages_by_hand(rows)
        for o in range(n_o):
            trailing = next((i for i, r in enumerate(reversed(rows)) if r[o]), len(rows))
            assert tracker.down_rows(o) == trailing


@pytest.mark.parametrize("lookback", [1000, 40])
def test_the_bound_on_the_longest_outage_holds_between_listings(lookback: int) -> None:
    """Listed every few steps (and rebuilt after a jump), the cheap bound is never below the
    longest outage the listing would give, and equals it where it was just listed."""
    rng = np.random.default_rng(5)
    n_t, n_o = 300, 5
    capacity = np.repeat(rng.random((n_t // 3 + 1, n_o)) < 0.5, rng.integers(1, 12), axis=0)
    capacity = capacity[:n_t].astype(float)
    capacity[180:, 0] = 0.0  # the longest, growing while it goes on

    class Grid:
        spot_capacity = capacity

    grid = Grid()  # one grid: the tracker steps from tick to tick on it
    tracker = LifetimeTracker(0.25, prior_hours=2.0, halflife_h=6.0, lookback=lookback)
    probe = LifetimeTracker(0.25, prior_hours=2.0, halflife_h=6.0, lookback=lookback)
    for i, k in enumerate([*range(n_t), 120, 121, 250]):
        tracker(SignalHistory(grid, k))  # type: ignore[arg-type]
        probe(SignalHistory(Grid(), k))  # type: ignore[arg-type]  # rebuilt each time
        longest = int(probe.outages()[1].max(initial=0))
        assert tracker.longest_outage_bound() >= longest
        if i % 7 == 0:
            tracker.outages()
            assert tracker.longest_outage_bound() == longest


def _seen(*outages: tuple[int, int, bool]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offer, length, ended = zip(*outages, strict=True)
    return np.array(offer), np.array(length), np.array(ended)


# Offer 0's own outages of 2, 4, 6 and 8 rows; its current one is 3 rows old.
OWN = _seen((0, 2, True), (0, 4, True), (0, 6, True), (0, 8, True), (0, 3, False))


@pytest.mark.parametrize(("odds", "rest"), [(0.3, 1.0), (0.5, 3.0), (0.8, 5.0), (1.0, 5.0)])
def test_the_rest_of_an_outage_at_odds_from_those_that_outlasted_it(
    odds: float, rest: float
) -> None:
    """Of its outages, 4, 6 and 8 rows outlasted the 3 it has lasted: 1, 3 or 5 rows more,
    one in three each (its own outage under way is not one of them)."""
    assert outage_rest_quantile(OWN, 0, 3, odds, pool=3.0) == rest


def test_the_other_offers_outages_weigh_as_pool_outages_together() -> None:
    """One outage of its own would end in 1 row, one of another offer's in 9: at even
    odds, the other's decides when it weighs three of its own, its own when a third."""
    seen = _seen((0, 3, True), (1, 11, True))
    assert outage_rest_quantile(seen, 0, 2, 0.5, pool=3.0) == 9.0
    assert outage_rest_quantile(seen, 0, 2, 0.5, pool=1 / 3) == 1.0


def test_outages_still_going_on_are_censored() -> None:
    """Two of its outages outlasted its age by 1 and 5 rows; another offer's has gone on 3
    rows past it and may end any time later. Kaplan-Meier: a third of the outages end
    after 1 row; past 3 rows only the one of 5 is left at risk, and it ends: at even odds,
    5 rows, where counting the one under way as ended would say 3. Where the estimate
    never reaches the odds (what is left is still going on), at least the longest rest
    seen."""
    seen = _seen((0, 3, True), (0, 7, True), (1, 5, False))
    assert outage_rest_quantile(seen, 0, 2, 0.5, pool=1.0) == 5.0
    longer = _seen((0, 3, True), (1, 12, False))
    assert outage_rest_quantile(longer, 0, 2, 0.8, pool=1.0) == 10.0


def test_an_outage_going_on_as_long_as_two_that_ended_is_at_risk_when_they_end() -> None:
    """Two of its outages ended after 2 rows and one after 5; another offer's has lasted 2
    rows and goes on. At 2 rows four are at risk and two end (half survive); at 5 the last
    one at risk ends. At odds 0.6 that is 5 rows. Had the one going on left the risk set
    before the two ended, a third would survive 2 rows, and the answer would be 2."""
    seen = _seen((0, 2, True), (0, 2, True), (0, 5, True), (1, 2, False))
    assert outage_rest_quantile(seen, 0, 0, 0.5, pool=1.0) == 2.0
    assert outage_rest_quantile(seen, 0, 0, 0.6, pool=1.0) == 5.0


def test_an_outage_longer_than_any_seen_is_expected_to_last_as_long_again() -> None:
    assert outage_rest_quantile(OWN, 0, 9, 0.5, pool=3.0) == 9.0
    assert outage_rest_quantile(_seen((0, 4, False)), 0, 4, 0.5, pool=3.0) == 4.0


def test_the_rest_grows_with_the_odds_up_to_the_longest_outage() -> None:
    rng = np.random.default_rng(5)
    seen = (rng.integers(0, 4, 60), rng.integers(1, 40, 60), rng.random(60) < 0.8)
    for age in [0, 1, 5, 20]:
        rests = [outage_rest_quantile(seen, 0, age, q, pool=3.0) for q in np.linspace(0.05, 1, 20)]
        assert rests == sorted(rests)
        assert rests[-1] <= max(age, seen[1].max() - age)  # the bound heliotrope skips on
