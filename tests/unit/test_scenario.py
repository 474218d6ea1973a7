"""The built-in scenario generator: determinism, format, and calibration properties."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.catalog import continent, grid_zone, instance_gpus
from orchestrator.errors import InputError
from orchestrator.signals import scenario
from orchestrator.signals.scenario import SPOT_DISCOUNT, generate
from orchestrator.signals.traces import COLUMNS, GRID_METRICS, Trace, read_trace, write_trace

DAYS = 21.0  # covers late April in the default start (CAISO's curtailment season)
FRAMES = ("offers", "prices", "spot", "grid")


@pytest.fixture(scope="module")
def trace() -> Trace:
    return generate(11, DAYS)


def _grid_wide(trace: Trace, zone: str) -> pd.DataFrame:
    g = trace.grid[trace.grid["grid_zone"] == zone]
    return g.pivot_table(index="time", columns="metric", values="value")


# --- determinism and format -------------------------------------------------------------


def test_same_seed_gives_identical_frames() -> None:
    a, b = generate(5, 4.0), generate(5, 4.0)
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name))
    assert a.manifest == b.manifest


def test_different_seed_gives_different_frames() -> None:
    a, b = generate(5, 4.0), generate(6, 4.0)
    pd.testing.assert_frame_equal(a.offers, b.offers)  # the scenario's offers are fixed
    for name in ("prices", "spot", "grid"):
        fa, fb = getattr(a, name), getattr(b, name)
        assert len(fa) != len(fb) or not fa.equals(fb), name


def test_longer_horizon_extends_a_shorter_one() -> None:
    short, long_ = generate(9, 3.0), generate(9, 6.0)
    cut = pd.Timestamp(datetime(2024, 4, 4, tzinfo=UTC))
    for name in ("prices", "spot", "grid"):
        a = getattr(short, name)
        b = getattr(long_, name)
        b = b[b["time"] < cut].reset_index(drop=True)
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b, obj=name)


def test_frames_have_the_trace_columns(trace: Trace) -> None:
    for name in FRAMES:
        assert list(getattr(trace, name).columns) == list(COLUMNS[name]), name
    assert set(trace.grid["metric"]) == set(GRID_METRICS)
    m = trace.manifest
    assert m["generator"] == "scenario" and m["seed"] == 11 and m["days"] == DAYS
    assert m["tick_s"] == 600 and m["sources"] and m["notes"]


def test_write_read_round_trip(trace: Trace, tmp_path: Path) -> None:
    out = write_trace(trace, tmp_path / "scenario")
    back = read_trace(out)
    for name in FRAMES:
        sort = ["time"] if name != "offers" else ["cloud", "region", "zone", "instance_type"]
        a = getattr(trace, name).sort_values(sort, kind="stable").reset_index(drop=True)
        b = getattr(back, name).sort_values(sort, kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, check_dtype=False, obj=name)
    assert back.manifest["seed"] == 11
    assert back.manifest["start"] == "2024-04-01T00:00:00+00:00"


def test_times_are_utc_and_inside_the_span(trace: Trace) -> None:
    start = pd.Timestamp(datetime(2024, 4, 1, tzinfo=UTC))
    end = start + timedelta(days=DAYS)
    for name in ("prices", "spot", "grid"):
        t = getattr(trace, name)["time"]
        assert str(t.dt.tz) == "UTC"
        assert t.min() == start and t.max() < end, name


def test_custom_start_and_tick() -> None:
    start = datetime(2024, 1, 1, 12, tzinfo=UTC)
    tr = generate(1, 2.0, start=start, tick_s=300)
    assert tr.spot["time"].min() == pd.Timestamp(start)
    offsets = (tr.spot["time"] - pd.Timestamp(start)).dt.total_seconds()
    assert (offsets % 300 == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"seed": 1, "days": 0}, "days"),
        ({"seed": 1, "days": float("nan")}, "days"),
        ({"seed": 1.5, "days": 1}, "seed"),
        ({"seed": 1, "days": 1, "tick_s": 7}, "tick_s"),
        ({"seed": 1, "days": 1, "start": datetime(2024, 4, 1)}, "start"),
    ],
)
def test_bad_arguments_raise_input_error(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as err:
        generate(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_a_hundred_days_generate_in_a_few_seconds() -> None:
    t0 = time.perf_counter()
    tr = generate(2, 100.0)
    assert time.perf_counter() - t0 < 10.0
    assert len(tr.grid) > 0


# --- offers -----------------------------------------------------------------------------


def test_offers_cover_aws_and_gcp_on_three_continents(trace: Trace) -> None:
    offers = trace.offers
    assert set(offers["cloud"]) == {"aws", "gcp"}
    regions = offers[["cloud", "region"]].drop_duplicates()
    assert 8 <= len(regions) <= 12
    assert (offers.groupby(["cloud", "region"])["zone"].nunique() == 2).all()
    continents = {continent(c, r) for c, r in regions.itertuples(index=False)}
    assert {"na", "eu"} <= continents and len(continents) >= 3


def test_offers_agree_with_the_catalog(trace: Trace) -> None:
    for row in trace.offers.itertuples(index=False):
        assert row.grid_zone == grid_zone(row.cloud, row.region)
        assert (row.gpu_type, row.gpu_count) == instance_gpus(row.cloud, row.instance_type)
    types = set(trace.offers["gpu_type"])
    assert {"A100-40GB", "A100-80GB", "H100", "L4", "V100"} <= types


def test_grid_covers_every_offer_grid_zone(trace: Trace) -> None:
    zones = set(trace.offers["grid_zone"])
    for metric in GRID_METRICS:
        have = set(trace.grid.loc[trace.grid["metric"] == metric, "grid_zone"])
        assert zones <= have, metric
    hourly = trace.grid[trace.grid["metric"] == "carbon_avg_g_per_kwh"]
    assert (hourly.groupby("grid_zone").size() == int(DAYS * 24)).all()


# --- prices -----------------------------------------------------------------------------


def _spot_with_on_demand(trace: Trace) -> pd.DataFrame:
    p = trace.prices
    od = p.loc[p["market"] == "on_demand", ["cloud", "region", "instance_type", "usd_per_hour"]]
    od = od.rename(columns={"usd_per_hour": "od"})
    spot = p[p["market"] == "spot"].merge(od, on=["cloud", "region", "instance_type"])
    return spot.assign(discount=1.0 - spot["usd_per_hour"] / spot["od"])


def test_every_offer_has_both_prices(trace: Trace) -> None:
    p = trace.prices
    od = p[p["market"] == "on_demand"]
    assert not od.duplicated(["cloud", "region", "instance_type"]).any()
    for row in trace.offers.itertuples(index=False):
        same = (
            (p["cloud"] == row.cloud)
            & (p["region"] == row.region)
            & (p["instance_type"] == row.instance_type)
        )
        in_zone = p["zone"].isin(["", row.zone])
        assert ((p["market"] == "on_demand") & same & in_zone).any()
        assert ((p["market"] == "spot") & same & in_zone).any()


def test_spot_discount_within_published_range(trace: Trace) -> None:
    spot = _spot_with_on_demand(trace)
    for cloud, (lo, hi) in SPOT_DISCOUNT.items():
        d = spot.loc[spot["cloud"] == cloud, "discount"]
        assert len(d) > 0
        assert d.min() >= lo - 1e-3 and d.max() <= hi + 1e-3, cloud


def test_aws_spot_prices_move_every_few_hours(trace: Trace) -> None:
    spot = trace.prices[(trace.prices["market"] == "spot") & (trace.prices["cloud"] == "aws")]
    changes = spot.groupby(["zone", "instance_type"]).size() - 1
    hours_between = DAYS * 24 / changes.clip(lower=1)
    assert 3.0 <= hours_between.median() <= 36.0


# --- spot capacity ----------------------------------------------------------------------


def _availability(trace: Trace) -> pd.Series:
    end = pd.Timestamp(trace.manifest["end"])
    out = {}
    for key, group in trace.spot.groupby(["zone", "instance_type"]):
        g = group.sort_values("time")
        t = pd.DatetimeIndex([*g["time"], end])
        dur = np.diff(t.asi8).astype(float)
        out[key] = float((dur * (g["capacity"].to_numpy() > 0)).sum() / dur.sum())
    return pd.Series(out)


def test_every_offer_has_a_spot_series_starting_at_the_start(trace: Trace) -> None:
    first = trace.spot.groupby(["zone", "instance_type"])["time"].min()
    assert len(first) == len(trace.offers)
    assert (first == pd.Timestamp(datetime(2024, 4, 1, tzinfo=UTC))).all()


def test_spot_capacity_counts(trace: Trace) -> None:
    cap = trace.spot["capacity"]
    assert cap.notna().all() and (cap >= 0).all() and (cap <= 8).all()
    assert (cap == np.round(cap)).all()


def test_availability_per_offer_is_plausible(trace: Trace) -> None:
    avail = _availability(trace)
    # Can't Be Late V100 zones: 17%-91% mean availability; lower Spot Advisor bands ~100%.
    assert avail.min() >= 0.05
    assert 0.4 <= avail.mean() <= 0.9
    assert (avail < 0.5).sum() >= 3  # some pools are scarce
    assert (avail > 0.9).sum() >= 3  # and some are plentiful


# --- change logs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "key", "value"),
    [
        ("prices", ["cloud", "region", "zone", "instance_type", "market"], "usd_per_hour"),
        ("spot", ["cloud", "zone", "instance_type"], "capacity"),
    ],
)
def test_frames_are_change_logs(trace: Trace, frame: str, key: list[str], value: str) -> None:
    f = getattr(trace, frame).sort_values([*key, "time"], kind="stable")
    same_key = (f[key] == f[key].shift()).all(axis=1)
    repeated = same_key & (f[value] == f[value].shift())
    assert not repeated.any()
    assert not f.duplicated([*key, "time"]).any()


# --- grid calibration -------------------------------------------------------------------


def test_yearly_levels_match_electricity_maps(trace: Trace) -> None:
    yearly = trace.grid[trace.grid["metric"] == "carbon_avg_yearly_g_per_kwh"]
    levels = dict(zip(yearly["grid_zone"], yearly["value"], strict=True))
    assert levels["SE-SE3"] < 50 < levels["US-NW-BPAT"] < levels["US-CAL-CISO"]
    assert levels["US-CAL-CISO"] < levels["NL"] < levels["US-MIDA-PJM"] < levels["JP-TK"]
    # Over the generated window the hourly mean stays near the zone's level (weather and
    # season move it, not by a factor).
    hourly = trace.grid[trace.grid["metric"] == "carbon_avg_g_per_kwh"]
    means = hourly.groupby("grid_zone")["value"].mean()
    for zone, level in levels.items():
        assert 0.5 * level <= means[zone] <= 1.6 * level, zone


def test_ciso_midday_carbon_lower_than_evening(trace: Trace) -> None:
    w = _grid_wide(trace, "US-CAL-CISO")
    hour = w.index.tz_convert("America/Los_Angeles").hour
    midday = w.loc[(hour >= 11) & (hour <= 14), "carbon_avg_g_per_kwh"].mean()
    evening = w.loc[(hour >= 19) & (hour <= 22), "carbon_avg_g_per_kwh"].mean()
    assert midday < 0.8 * evening  # duck curve: ~40% dip


def test_ciso_curtails_only_in_daylight_and_does_in_spring(trace: Trace) -> None:
    w = _grid_wide(trace, "US-CAL-CISO")
    hour = w.index.tz_convert("America/Los_Angeles").hour
    curtail = w["curtailment_mw"]
    assert (curtail >= 0).all()
    assert (curtail[(hour < 7) | (hour >= 19)] == 0).all()
    assert curtail.max() >= 2000  # several GW at the spring midday peak
    assert (curtail > 0).sum() >= 0.5 * DAYS  # on most spring days


def test_a_windy_zone_curtails_too(trace: Trace) -> None:
    w = _grid_wide(trace, "DE")
    assert (w["curtailment_mw"] > 0).any()


def test_negative_prices_only_while_curtailing(trace: Trace) -> None:
    for zone in set(trace.grid["grid_zone"]):
        w = _grid_wide(trace, zone)
        negative = w["power_price_usd_per_mwh"] < 0
        assert (w.loc[negative, "curtailment_mw"] > 0).all(), zone
    ciso = _grid_wide(trace, "US-CAL-CISO")
    assert (ciso["power_price_usd_per_mwh"] < 0).any()  # spring oversupply


def test_marginal_near_zero_while_curtailing_else_fossil(trace: Trace) -> None:
    for zone in set(trace.grid["grid_zone"]):
        w = _grid_wide(trace, zone)
        curtailing = w["curtailment_mw"] > 0
        assert (w.loc[curtailing, "carbon_marginal_g_per_kwh"] < 50).all(), zone
        fossil = w.loc[~curtailing, "carbon_marginal_g_per_kwh"]
        assert fossil.between(350, 1200).all(), zone


def test_carbon_is_non_negative_and_hourly(trace: Trace) -> None:
    g = trace.grid
    carbon = g[g["metric"].str.startswith("carbon")]
    assert (carbon["value"] >= 0).all()
    hourly = g[g["metric"] == "carbon_avg_g_per_kwh"]
    assert (hourly["time"].dt.minute == 0).all()


def test_scenario_regions_are_known_to_the_catalog() -> None:
    for r in scenario.REGIONS:
        assert grid_zone(r.cloud, r.region) in scenario.GRID_ZONES


def test_every_grid_zone_has_a_clock() -> None:
    assert set(scenario.TIMEZONES) == set(scenario.GRID_ZONES)
