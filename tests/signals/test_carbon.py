"""Electricity Maps, WattTime and the UK Carbon Intensity API against recorded answers."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from orchestrator.signals.sources.base import FRAME_COLUMNS
from orchestrator.signals.sources.carbon import ElectricityMaps, UkCarbon, WattTime
from orchestrator.signals.sources.errors import AuthFailed, MalformedResponse
from orchestrator.units import g_per_kwh_from_lbs_per_mwh
from tests.signals.conftest import NOW, make_ctx
from tests.signals.server import FixtureServer, Reply

EM = r"/carbon-intensity/"


def _frame_ok(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == list(FRAME_COLUMNS)
    for col in ("time", "observed_at", "valid_until"):
        assert str(frame[col].dt.tz) == "UTC", col
    assert (frame["valid_until"] > frame["time"]).all()
    assert (frame["observed_at"] == pd.Timestamp(NOW)).all()


def test_electricitymaps_history_and_forecast(server: FixtureServer) -> None:
    server.add(EM + "history$", Reply.file("em_history_DE.json"))
    server.add(EM + "forecast$", Reply.file("em_forecast_DE.json"))
    frame = ElectricityMaps(make_ctx(server)).read(
        ["DE"], NOW - timedelta(hours=24), NOW + timedelta(hours=6)
    )
    _frame_ok(frame)
    past = frame[frame["source"] == "electricitymaps"]
    future = frame[frame["source"] == "electricitymaps-forecast"]
    assert len(past) == 24 and len(future) == 7  # 04:00 .. 10:00 inclusive
    assert past["value"].isna().sum() == 1  # a null intensity is unknown, not zero
    assert set(frame["kind"]) == {"carbon"} and set(frame["unit"]) == {"g_co2_per_kwh"}
    first = past.iloc[0]
    assert first["time"] == pd.Timestamp("2024-03-30T04:00Z") and first["value"] == 412
    assert first["valid_until"] == pd.Timestamp("2024-03-30T06:00Z")
    (req,) = server.hits("history$")
    assert req.q("zone") == "DE"


def test_electricitymaps_past_range_for_old_windows(server: FixtureServer) -> None:
    server.add(EM + "past-range$", Reply.file("em_past_range_DE.json"))
    start = datetime(2024, 3, 1, tzinfo=UTC)
    frame = ElectricityMaps(make_ctx(server)).read(["DE"], start, start + timedelta(hours=47))
    assert len(frame) == 48
    (req,) = server.hits("past-range$")
    assert req.q("start") == "2024-03-01T00:00:00Z" and req.q("end") == "2024-03-02T23:00:00Z"


def test_electricitymaps_forecast_not_in_plan_is_skipped(server: FixtureServer) -> None:
    server.add(EM + "history$", Reply.file("em_history_DE.json"))
    server.add(EM + "forecast$", Reply(403, b'{"message": "not in your plan"}'))
    frame = ElectricityMaps(make_ctx(server)).read(
        ["DE"], NOW - timedelta(hours=2), NOW + timedelta(hours=2)
    )
    assert set(frame["source"]) == {"electricitymaps"}


@pytest.mark.parametrize(
    ("fixture", "field", "reason"),
    [
        ("em_history_nan.json", "history[5].carbonIntensity", "finite number"),
        ("em_history_negative.json", "history[7].carbonIntensity", "greater than or equal to 0"),
        ("em_history_missing.json", "history[3].datetime", "Field required"),
        ("em_history_truncated.json", "body", "not JSON"),
    ],
)
def test_electricitymaps_malformed_is_rejected_with_a_reason(
    server: FixtureServer, fixture: str, field: str, reason: str
) -> None:
    server.add(EM + "history$", Reply.file(fixture))
    with pytest.raises(MalformedResponse) as err:
        ElectricityMaps(make_ctx(server)).read(["DE"], NOW - timedelta(hours=24), NOW)
    msg = str(err.value)
    assert msg.startswith("electricitymaps: malformed response")
    assert field in msg and reason in msg


def test_electricitymaps_wrong_zone_is_malformed(server: FixtureServer) -> None:
    server.add(EM + "history$", Reply.file("em_history_DE.json"))
    with pytest.raises(MalformedResponse, match="zone: expected 'FR'"):
        ElectricityMaps(make_ctx(server)).read(["FR"], NOW - timedelta(hours=24), NOW)


def test_electricitymaps_one_bad_key_does_not_stop_the_others(server: FixtureServer) -> None:
    def answer(req):  # type: ignore[no-untyped-def]
        if req.q("zone") == "FR":
            return Reply(500, b"")
        return Reply.file("em_history_DE.json")

    server.add(EM + "history$", handler=answer)
    frame, errors = ElectricityMaps(make_ctx(server)).read_partial(
        ["FR", "DE"], NOW - timedelta(hours=24), NOW
    )
    assert set(errors) == {"FR"} and len(frame) == 24


def test_uk_carbon_across_the_bst_switch(server: FixtureServer) -> None:
    server.add(r"^/intensity/[^/]+/[^/]+$", Reply.file("uk_intensity_range.json"))
    frame = UkCarbon(make_ctx(server)).read(["GB"], NOW - timedelta(hours=24), NOW)
    _frame_ok(frame)
    obs = frame[frame["source"] == "uk-carbon"]
    fc = frame[frame["source"] == "uk-carbon-forecast"]
    assert len(obs) == 47 and len(fc) == 1  # the last half-hour has no actual yet
    times = frame["time"].sort_values()
    assert (times.diff().dropna() == pd.Timedelta(minutes=30)).all()  # no hole, no repeat
    # 00:30Z-01:00Z (GMT) and 01:00Z-01:30Z (BST 02:00 local) are consecutive half-hours
    assert pd.Timestamp("2024-03-31T00:30Z") in set(times)
    assert pd.Timestamp("2024-03-31T01:00Z") in set(times)
    (req,) = server.requests
    assert req.path == "/intensity/2024-03-30T04:00Z/2024-03-31T04:00Z"


def test_uk_carbon_forecast_ahead(server: FixtureServer) -> None:
    server.add(r"/fw24h$", Reply.file("uk_intensity_fw24h.json"))
    server.add(r"^/intensity/", Reply.file("uk_intensity_range.json"))
    frame = UkCarbon(make_ctx(server)).read(
        ["GB"], NOW - timedelta(hours=1), NOW + timedelta(hours=24)
    )
    assert (frame[frame["time"] >= pd.Timestamp(NOW)]["source"] == "uk-carbon-forecast").all()
    uk = UkCarbon(make_ctx(server))
    assert uk.default_keys([("aws", "us-east-1")]) == []
    assert uk.default_keys([("aws", "eu-west-2"), ("gcp", "europe-west2")]) == ["GB"]


def test_watttime_login_then_moer_in_g_per_kwh(server: FixtureServer) -> None:
    server.add(r"^/login$", Reply.file("wt_login.json"))
    server.add(r"^/v3/historical$", Reply.file("wt_historical.json"))
    server.add(r"^/v3/signal-index$", Reply.file("wt_signal_index.json"))
    server.add(r"^/v3/forecast$", Reply.file("wt_forecast.json"))
    frame = WattTime(make_ctx(server)).read(
        ["US-CAL-CISO"], NOW - timedelta(hours=1), NOW + timedelta(hours=2)
    )
    _frame_ok(frame)
    hist = frame[frame["source"] == "watttime"]
    assert len(hist) == 12 and set(hist["unit"]) == {"g_co2_per_kwh_marginal"}
    assert hist.iloc[0]["value"] == pytest.approx(g_per_kwh_from_lbs_per_mwh(880.0))
    assert hist.iloc[0]["value"] == pytest.approx(399.2, abs=0.1)  # 880 lbs/MWh
    index = frame[frame["source"] == "watttime-index"]
    assert list(index["value"]) == [54.0] and set(index["unit"]) == {"percentile"}
    fc = frame[frame["source"] == "watttime-forecast"]
    assert len(fc) == 25 and (fc["time"] >= pd.Timestamp(NOW)).all()
    login = server.hits("^/login$")[0]
    assert login.headers["Authorization"].startswith("Basic ")
    data = server.hits("^/v3/historical$")[0]
    assert data.headers["Authorization"] == "Bearer eyJhbGciOiJIUzI1NiJ9.wt-session-token-abc123"
    assert data.q("region") == "CAISO_NORTH" and data.q("signal_type") == "co2_moer"
    assert len(server.hits("^/login$")) == 1  # the token is reused


def test_watttime_bad_login_is_auth_failed(server: FixtureServer) -> None:
    server.add(r"^/login$", Reply(401, b'{"error": "invalid credentials"}'))
    with pytest.raises(AuthFailed, match="watttime: login: HTTP 401"):
        WattTime(make_ctx(server)).read(["US-CAL-CISO"], NOW - timedelta(hours=1), NOW)


def test_watttime_wrong_units_rejected(server: FixtureServer) -> None:
    server.add(r"^/login$", Reply.file("wt_login.json"))
    server.add(
        r"^/v3/historical$",
        Reply(
            200,
            Reply.file("wt_historical.json").body.replace(b"lbs_co2_per_mwh", b"kg_co2_per_mwh"),
        ),
    )
    with pytest.raises(MalformedResponse, match=r"meta\.units"):
        WattTime(make_ctx(server)).read(
            ["US-CAL-CISO"], NOW - timedelta(hours=1), NOW - timedelta(minutes=1)
        )


def test_null_intensity_stays_unknown(server: FixtureServer) -> None:
    server.add(EM + "history$", Reply.file("em_history_DE.json"))
    frame = ElectricityMaps(make_ctx(server)).read(["DE"], NOW - timedelta(hours=24), NOW)
    gap = frame[frame["value"].isna()]
    assert len(gap) == 1 and math.isnan(gap.iloc[0]["value"])
