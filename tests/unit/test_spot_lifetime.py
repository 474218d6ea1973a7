"""`LifetimeTracker` against the weighted sums written out run by run, tick by tick."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.signals.history import SignalHistory
from policies.spot_lifetime import LifetimeTracker


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
    for k in [*range(capacity.shape[0]), 5, 6, 40]:  # tick by tick, then back: from rows
        got = tracker(SignalHistory(Grid(), k))  # type: ignore[arg-type]
        for o in range(n_o):
            up = [bool(c > 0) for c in capacity[: k + 1, o]]
            life, outage, young, age, mature = _by_hand(up, tick_h, 3.0, young_h)
            assert got[o] == pytest.approx(life, rel=1e-9)
            assert tracker.outage_h[o] == pytest.approx(outage, rel=1e-9)
            assert tracker.young_death[o] == pytest.approx(young, rel=1e-9)
            assert tracker.age_h[o] == pytest.approx(age)
            assert tracker.mature_h[o] == pytest.approx(mature, rel=1e-9)
