"""A samples log grouped at once (`series_from_frame`, what a replay of a trace directory
uses) gives the same series, and the same replay grid, as the samples one by one
(`series_from_samples`, the live view)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from orchestrator.live.world import local_offers
from orchestrator.model import SignalKind
from orchestrator.signals.sources.keys import price_key, spot_key
from orchestrator.signals.view import (
    grid_from_samples,
    list_priors,
    series_from_frame,
    series_from_samples,
)
from orchestrator.state.records import SignalSample, samples_to_frame

T0 = datetime(2024, 4, 2, 6, tzinfo=UTC)


def a_log() -> list[SignalSample]:
    rng = np.random.default_rng(3)
    offers = local_offers()
    out = []
    for i in range(300):
        o = offers[int(rng.integers(len(offers)))]
        t = T0 + timedelta(minutes=10 * int(rng.integers(0, 144)))
        late = timedelta(minutes=int(rng.integers(0, 30)))
        which = i % 5
        if which == 0:
            kind, unit, value = SignalKind.PRICE, "usd_per_hour", rng.uniform(0.1, 1)
            key = price_key(o.cloud, o.region, o.zone, o.instance_type, o.market.value)
        elif which == 1:
            kind, unit, value = SignalKind.CARBON, "g_co2_per_kwh", rng.uniform(10, 900)
            key = o.grid_zone
        elif which == 2:
            kind, unit, value = SignalKind.SPOT_AVAILABILITY, "placement_score", rng.integers(1, 11)
            key = spot_key(o.cloud, o.region, o.zone, o.instance_type)
        elif which == 3:
            kind, unit, value = SignalKind.CARBON, "g_co2_per_kwh", rng.uniform(10, 900)
            key = o.grid_zone
        else:
            kind, unit, value = SignalKind.CURTAILMENT, "mw", rng.uniform(0, 500)
            key = o.grid_zone
        out.append(
            SignalSample(
                time=t,
                key=key,
                kind=kind,
                value=float(value),
                unit=unit,
                source="em" if which != 3 else "em-forecast",
                observed_at=t + late,
                valid_until=t + timedelta(hours=2) if which == 4 else None,
            )
        )
    return out


def test_the_same_series_as_one_by_one() -> None:
    log = a_log()
    fast = series_from_frame(samples_to_frame(log))
    slow = series_from_samples(log)
    assert fast.keys() == slow.keys() and fast
    for key, s in slow.items():
        for a, b in zip(fast[key].cols(), s.cols(), strict=True):
            np.testing.assert_array_equal(a, b)


def test_the_same_replay_grid() -> None:
    log = a_log()
    frame = samples_to_frame(log)
    offers = local_offers()
    args = dict(tick_s=600, priors=list_priors(offers, 4.0))
    end = (T0 + timedelta(days=1)).timestamp()
    a = grid_from_samples(frame, offers, T0.timestamp(), end, **args)  # type: ignore[arg-type]
    b = grid_from_samples(log, offers, T0.timestamp(), end, **args)  # type: ignore[arg-type]
    for name in ("usd_per_hour", "spot_capacity", "carbon_g_per_kwh", "curtailing"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    prior = grid_from_samples([], offers, T0.timestamp(), end, **args)  # type: ignore[arg-type]
    for name in ("usd_per_hour", "spot_capacity", "carbon_g_per_kwh"):  # the log counted
        assert not np.array_equal(getattr(a, name), getattr(prior, name), equal_nan=True), name
