"""`live.clouds.carbon.CarbonIndex`: the grid carbon `heliotrope offers` shows per zone, and
where it came from: the newest hourly sample (a trace's or the state store's) at or before
now, else the zone's yearly average (the trace's, else the built-in scenario's), else the
world average."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pandas as pd

from orchestrator.live.clouds.carbon import HOURLY, YEARLY, CarbonIndex
from orchestrator.model import SignalKind
from orchestrator.signals.grid import WORLD_AVG_G_PER_KWH
from orchestrator.signals.scenario import GRID_ZONES
from orchestrator.signals.traces import Trace, empty_frame, make_manifest
from orchestrator.state import MemoryStateStore
from orchestrator.state.records import SignalSample

NOW = datetime(2024, 3, 5, 12, 0, tzinfo=UTC)


def _trace(rows: list[tuple[str, str, datetime, float]]) -> Trace:
    grid = pd.DataFrame(
        {
            "time": pd.to_datetime([r[2] for r in rows], utc=True),
            "grid_zone": [r[0] for r in rows],
            "metric": [r[1] for r in rows],
            "value": [r[3] for r in rows],
            "source": "test",
        }
    )
    return Trace(
        offers=empty_frame("offers"),
        prices=empty_frame("prices"),
        spot=empty_frame("spot"),
        grid=grid,
        manifest=make_manifest(generator="test"),
    )


def test_hourly_before_yearly_and_never_a_later_hour() -> None:
    trace = _trace(
        [
            ("DE", HOURLY, NOW - timedelta(hours=2), 300.0),
            ("DE", HOURLY, NOW - timedelta(hours=1), 310.0),
            ("DE", HOURLY, NOW + timedelta(hours=1), 999.0),  # after now: not seen
            ("DE", HOURLY, NOW - timedelta(minutes=30), math.nan),  # unknown: skipped
            ("DE", YEARLY, datetime(2023, 1, 1, tzinfo=UTC), 380.0),
            ("DE", YEARLY, datetime(2024, 1, 1, tzinfo=UTC), 350.0),
            ("DE", "curtailment_mw", NOW, 5.0),
        ]
    )
    index = CarbonIndex.build(["DE"], trace=trace)
    reading = index.at("DE", NOW.timestamp())
    assert reading.hourly and reading.g_per_kwh == 310.0
    assert reading.source == "hourly 2024-03-05T11:00Z (trace test)"
    early = index.at("DE", (NOW - timedelta(hours=3)).timestamp())
    assert not early.hourly and early.g_per_kwh == 350.0  # the latest year
    assert early.source == "yearly average 2024 (trace test)"
    assert index.extra_rows is not None and list(index.extra_rows["metric"]) == ["curtailment_mw"]


def _sample(zone: str, when: datetime, value: float) -> SignalSample:
    return SignalSample(
        time=when,
        key=zone,
        kind=SignalKind.CARBON,
        value=value,
        unit="g_co2_per_kwh",
        source="electricitymaps",
        observed_at=NOW,
    )


def test_store_samples_count_and_the_scenario_and_world_average_fill_in() -> None:
    zone = next(iter(GRID_ZONES))
    store = MemoryStateStore()
    store.append_samples(
        [
            _sample(zone, NOW - timedelta(hours=1), 123.0),
            _sample(zone, NOW - timedelta(days=30), 1.0),  # before the lookback: not asked for
        ]
    )
    index = CarbonIndex.build([zone, "XX-NOWHERE"], store=store, now_s=NOW.timestamp())
    got = index.at(zone, NOW.timestamp())
    assert got.hourly and got.g_per_kwh == 123.0 and "store electricitymaps" in got.source
    before = index.at(zone, (NOW - timedelta(days=2)).timestamp())
    assert before.g_per_kwh == float(GRID_ZONES[zone].yearly_g)
    assert before.source == "yearly average (scenario, Electricity Maps 2024)"
    nowhere = index.at("XX-NOWHERE", NOW.timestamp())
    assert nowhere.g_per_kwh == WORLD_AVG_G_PER_KWH and not nowhere.hourly
