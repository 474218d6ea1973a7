"""ENTSO-E day-ahead prices, EIA-930 generation mix and CAISO curtailment."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta

import pandas as pd
import pytest

from orchestrator.signals.importers.power import EUR_TO_USD
from orchestrator.signals.sources.errors import MalformedResponse
from orchestrator.signals.sources.power import (
    EMISSION_FACTORS,
    ENTSOE_TYPE_FACTORS,
    Eia930,
    Entsoe,
    EntsoeGeneration,
    balancing_area,
    eia_period_utc,
    entsoe_intensity,
    parse_caiso_report,
    parse_entsoe_prices,
)
from tests.signals.conftest import NOW, make_ctx
from tests.signals.server import FixtureServer, Reply, recorded


def test_entsoe_dst_day_negative_prices_and_a03_gaps(server: FixtureServer) -> None:
    server.add(r"^/$", Reply.file("entsoe_a44_DE_dst.xml"))
    start = datetime(2024, 3, 29, 23, tzinfo=UTC)
    frame = Entsoe(make_ctx(server)).read(["DE"], start, start + timedelta(hours=47))
    assert len(frame) == 24 + 23  # the CET spring-forward day has 23 hours
    times = frame["time"]
    assert (times.diff().dropna() == pd.Timedelta(hours=1)).all()
    assert set(frame["unit"]) == {"usd_per_mwh"} and set(frame["kind"]) == {"power_price"}
    day2 = frame[frame["time"] >= pd.Timestamp("2024-03-30T23:00Z")].reset_index(drop=True)
    assert day2.loc[3, "value"] == pytest.approx(48.0 * EUR_TO_USD)  # positions 4, 5 repeat 3
    assert day2.loc[4, "value"] == pytest.approx(48.0 * EUR_TO_USD)
    assert (day2["value"] < 0).sum() == 6  # negative prices kept
    assert day2["value"].min() == pytest.approx(-18.9 * EUR_TO_USD)
    assert (frame["valid_until"] - frame["time"] == pd.Timedelta(hours=1)).all()
    (req,) = server.requests
    assert req.q("documentType") == "A44" and req.q("in_Domain") == "10Y1001A1001A82H"
    assert req.q("periodStart") == "202403292300" and req.q("periodEnd") == "202403312200"


def test_entsoe_no_matching_data_is_empty(server: FixtureServer) -> None:
    server.add(r"^/$", Reply.file("entsoe_ack_no_data.xml"))
    frame = Entsoe(make_ctx(server)).read(["NL"], NOW, NOW + timedelta(hours=3))
    assert frame.empty


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda b: b.replace(
                b"<price.amount>42.5</price.amount>", b"<price.amount>NaN</price.amount>"
            ),
            "finite price",
        ),
        (
            lambda b: b.replace(b"<currency_Unit.name>EUR", b"<currency_Unit.name>GBP", 1),
            "currency_Unit.name",
        ),
        (
            lambda b: b.replace(
                b"<resolution>PT60M</resolution>", b"<resolution>P1D</resolution>", 1
            ),
            "resolution",
        ),
        (lambda b: b[: len(b) // 2], "not XML"),
        (lambda b: b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>', "DTD"),
    ],
)
def test_entsoe_malformed(edit, match: str) -> None:  # type: ignore[no-untyped-def]
    body = edit(recorded("entsoe_a44_DE_dst.xml"))
    with pytest.raises(MalformedResponse, match=match):
        parse_entsoe_prices(body, "DE")


def test_entsoe_bidding_zone_map_uses_grid_zone_ids() -> None:
    ctx_source = Entsoe.__new__(Entsoe)
    assert ctx_source.covers("DE") and ctx_source.covers("SE-SE3")
    assert not ctx_source.covers("GB")  # GB left the ENTSO-E day-ahead coupling


def test_eia_pagination_and_intensity(server: FixtureServer) -> None:
    def page(req):  # type: ignore[no-untyped-def]
        name = "eia_fuel_type_page1.json" if req.q("offset") == "0" else "eia_fuel_type_page2.json"
        return Reply.file(name)

    server.add(r"/electricity/rto/fuel-type-data/data/$", handler=page)
    ctx = make_ctx(server, eia_page_size=16)
    start = datetime(2024, 3, 10, 8, tzinfo=UTC)
    frame = Eia930(ctx).read(["US-CAL-CISO"], start, start + timedelta(hours=1))
    reqs = server.hits("fuel-type-data")
    assert [r.q("offset") for r in reqs] == ["0", "16"]
    assert reqs[0].q("facets[respondent][]") == "CISO" and reqs[0].q("frequency") == "hourly"
    assert len(frame) == 2 and set(frame["source"]) == {"eia930"}
    mix = {"GEO": 812, "NG": 6021, "NUC": 2255, "OTH": 141, "WAT": 1460, "WND": 1733}
    expected = sum(v * EMISSION_FACTORS[f] for f, v in mix.items()) / sum(mix.values())
    assert frame["value"].tolist() == pytest.approx([expected, expected])  # storage out,
    # negative solar clipped to 0, the null UNK row skipped


def test_eia_periods_utc_and_local_hourly_across_fall_back() -> None:
    assert eia_period_utc("2024-03-10T08") == datetime(2024, 3, 10, 8, tzinfo=UTC)
    # local-hourly: the two 01:00 hours of the fall-back night are distinct UTC hours
    first = eia_period_utc("2024-11-03T01-07")
    second = eia_period_utc("2024-11-03T01-08")
    assert second - first == timedelta(hours=1)
    assert first == datetime(2024, 11, 3, 8, tzinfo=UTC)
    with pytest.raises(MalformedResponse):
        eia_period_utc("2024-13-03T01")


def test_eia_balancing_areas() -> None:
    assert balancing_area("US-CAL-CISO") == "CISO" and balancing_area("US-MIDA-PJM") == "PJM"
    assert balancing_area("DE") is None


def test_eia_empty_page_with_more_promised_is_malformed(server: FixtureServer) -> None:
    body = b'{"response": {"total": "40", "data": []}}'
    server.add(r"fuel-type-data", Reply(200, body))
    with pytest.raises(MalformedResponse, match="empty page"):
        Eia930(make_ctx(server)).read(["US-CAL-CISO"], NOW - timedelta(hours=2), NOW)


def test_caiso_spring_forward_day_has_23_hours() -> None:
    rows = parse_caiso_report(recorded("caiso_20240310.csv"), date(2024, 3, 10))
    assert len(rows) == 23
    assert rows[0].time == datetime(2024, 3, 10, 8, tzinfo=UTC)  # local midnight, PST
    assert rows[-1].time == datetime(2024, 3, 11, 6, tzinfo=UTC)  # 23:00 PDT
    by_he = {i + 1: r.value for i, r in enumerate(rows)}
    assert by_he[10] == 1203 + 310  # summed over reasons
    assert by_he[12] == 88  # no MWh: the hour's MW stands in
    assert by_he[1] == 0  # an hour without a row had no curtailment
    assert by_he[9] == 412 and rows[8].time == datetime(2024, 3, 10, 16, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("DATE,HOUR,CURTAILED MWH\n2024-03-10,24,5\n", "hour ending"),
        ("DATE,HOUR,CURTAILED MWH\n2024-03-10,3,-5\n", ">= 0"),
        ("DATE,HOUR,CURTAILED MWH\n2024-03-11,3,5\n", "date"),
        ("DATE,FOO\n", "column"),
        ("", "empty"),
    ],
)
def test_caiso_malformed(text: str, match: str) -> None:
    with pytest.raises(MalformedResponse, match=match):
        parse_caiso_report(text, date(2024, 3, 10))


def test_entsoe_server_error_is_retried_through_entsoe_py(server: FixtureServer) -> None:
    server.add(r"^/$", Reply(503, "busy"), Reply(503, "busy"), Reply.file("entsoe_a44_DE_dst.xml"))
    ctx = make_ctx(server)
    waits: list[float] = []
    ctx.sleep = waits.append
    start = datetime(2024, 3, 29, 23, tzinfo=UTC)
    frame = Entsoe(ctx).read(["DE"], start, start + timedelta(hours=47))
    assert len(frame) == 47 and len(server.requests) == 3 and len(waits) == 2
    assert server.requests[0].headers.get("user-agent", "").startswith("entsoe-py")


def test_entsoe_generation_mix_to_average_intensity(server: FixtureServer) -> None:
    server.add(r"^/$", Reply.file("entsoe_a75_DE_20240330.xml"))
    start = datetime(2024, 3, 30, 0, tzinfo=UTC)
    frame = EntsoeGeneration(make_ctx(server)).read(["DE"], start, start + timedelta(hours=23))
    (req,) = server.requests
    assert (req.q("documentType"), req.q("processType"), req.q("in_Domain")) == (
        "A75",
        "A16",
        "10Y1001A1001A82H",
    )
    assert len(frame) == 24 and set(frame["unit"]) == {"g_co2_per_kwh"}
    assert set(frame["source"]) == {"entsoe-generation"} and set(frame["kind"]) == {"carbon"}
    # noon: the recorded MW per type, pumped storage (generating 0, pumping 1200) left out
    mw = {
        "Fossil Brown coal/Lignite": 7242,
        "Fossil Gas": 3436,
        "Fossil Hard coal": 2149,
        "Hydro Run-of-river and pondage": 1450,
        "Solar": 21000,
        "Wind Offshore": 3029,
        "Wind Onshore": 17637,
    }
    expected = sum(v * ENTSOE_TYPE_FACTORS[k] for k, v in mw.items()) / sum(mw.values())
    noon = frame[frame["time"] == pd.Timestamp("2024-03-30T12:00Z")]
    assert noon["value"].iloc[0] == pytest.approx(expected)
    assert frame.loc[frame["value"].idxmin(), "time"] == pd.Timestamp("2024-03-30T12:00Z")
    assert (frame["valid_until"] - frame["time"] == pd.Timedelta(hours=3)).all()


def test_entsoe_generation_frame_validation() -> None:
    index = pd.date_range("2024-03-30", periods=2, freq="1h")
    with pytest.raises(MalformedResponse, match="UTC offset"):
        entsoe_intensity(pd.DataFrame({"Solar": [1.0, 2.0]}, index=index), "DE")
    aware = index.tz_localize("UTC")
    with pytest.raises(MalformedResponse, match="finite"):
        entsoe_intensity(pd.DataFrame({"Solar": [1.0, math.inf]}, index=aware), "DE")
    rows = entsoe_intensity(
        pd.DataFrame({"Solar": [0.0, -5.0], "Mystery": [9.0, 9.0]}, index=aware), "DE"
    )
    assert all(math.isnan(r.value) for r in rows)  # nothing generated: unknown, not 0
