"""US ISO day-ahead prices and CAISO curtailment through gridstatus, offline.

gridstatus fetches fixed public URLs with module-level ``requests.get``, so the recorded
bodies are served at the requests layer by the `responses` library (what gridstatus itself
sends goes through; nothing of ours is replaced). Skipped where the ``grid`` extra is not
installed."""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.request
import urllib.response
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pandas as pd
import pytest

from orchestrator.signals.sources.errors import (
    AuthFailed,
    MalformedResponse,
    SourceUnavailable,
)
from orchestrator.signals.sources.isos import (
    PRICE_SOURCES,
    CaisoCurtailment,
    curtailment_obs,
    lmp_obs,
)
from orchestrator.signals.sources.library import MissingLibrary, require
from tests.signals.conftest import CREDS, make_ctx
from tests.signals.iso_fakes import (
    CAISO_REPORT,
    MISO_DAM,
    NYISO_DAM,
    OASIS,
    OASIS_HEADERS,
    PJM_KEY,
    PJM_LMPS,
    PJM_PNODES,
    RecordedUrls,
    data_miner,
    oasis_zip,
)
from tests.signals.server import FixtureServer, recorded

pytest.importorskip("gridstatus")
responses = pytest.importorskip("responses")

SPRING = datetime(2024, 3, 10, 8, tzinfo=UTC)  # Pacific midnight of the spring-forward day


@pytest.fixture
def http() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def test_caiso_curtailment_from_the_daily_report_without_a_url(
    http: responses.RequestsMock, server: FixtureServer
) -> None:
    http.get(
        CAISO_REPORT.format(slug="mar-10-2024"), body=recorded("caiso_renewables_mar-10-2024.html")
    )
    ctx = make_ctx(server)
    ctx.base_urls = {}  # nothing configured
    frame = CaisoCurtailment(ctx).read(["US-CAL-CISO"], SPRING, SPRING + timedelta(hours=22))
    # the spring-forward day has 23 hours; gridstatus' 24th row is the next day's first
    assert len(frame) == 23 and frame["time"].is_unique
    assert frame["time"].iloc[0] == pd.Timestamp("2024-03-10T08:00Z")
    assert frame["time"].iloc[-1] == pd.Timestamp("2024-03-11T06:00Z")
    assert set(frame["unit"]) == {"mw"} and set(frame["kind"]) == {"curtailment"}
    by_time = dict(zip(frame["time"], frame["value"], strict=True))
    # local 12:00 PDT = 19:00 UTC: solar 905 MWh over types and reasons, no wind
    assert by_time[pd.Timestamp("2024-03-10T19:00Z")] == pytest.approx(905.0)
    assert by_time[pd.Timestamp("2024-03-10T09:00Z")] == pytest.approx(35.0)  # wind at night
    assert by_time[pd.Timestamp("2024-03-11T03:00Z")] == 0.0  # 'NA' next to zeros: summed
    assert (frame["valid_until"] - frame["time"] == pd.Timedelta(hours=2)).all()


def test_caiso_curtailment_missing_report_is_a_gap(
    http: responses.RequestsMock, server: FixtureServer
) -> None:
    http.get(
        CAISO_REPORT.format(slug="mar-10-2024"), body=recorded("caiso_renewables_mar-10-2024.html")
    )
    http.get(CAISO_REPORT.format(slug="mar-11-2024"), status=404)
    http.get(
        CAISO_REPORT.format(slug="mar-11-2024").replace(".html", "-corrected.html"), status=404
    )
    frame = CaisoCurtailment(make_ctx(server)).read(
        ["US-CAL-CISO"], SPRING, SPRING + timedelta(hours=30)
    )
    assert len(frame) == 23  # the 11th has no report yet


def test_caiso_curtailment_server_error_is_retried_then_unavailable(
    http: responses.RequestsMock, server: FixtureServer
) -> None:
    for suffix in ("", "-corrected"):
        http.get(CAISO_REPORT.format(slug=f"mar-10-2024{suffix}"), status=503)
    sleeps: list[float] = []
    ctx = make_ctx(server)
    ctx.sleep = sleeps.append
    with pytest.raises(SourceUnavailable, match="HTTP 503"):
        CaisoCurtailment(ctx).read(["US-CAL-CISO"], SPRING, SPRING + timedelta(hours=3))
    assert len(sleeps) == 3  # 4 attempts


def test_caiso_curtailment_truncated_report_is_malformed(
    http: responses.RequestsMock, server: FixtureServer
) -> None:
    page = recorded("caiso_renewables_mar-10-2024.html")
    http.get(CAISO_REPORT.format(slug="mar-10-2024"), body=page[: len(page) // 2])
    with pytest.raises(MalformedResponse, match="caiso-curtailment: malformed response"):
        CaisoCurtailment(make_ctx(server)).read(
            ["US-CAL-CISO"], SPRING, SPRING + timedelta(hours=3)
        )


def test_caiso_day_ahead_prices_negative_kept(
    http: responses.RequestsMock, server: FixtureServer
) -> None:
    http.get(OASIS, body=oasis_zip("caiso_oasis_prc_lmp_dam_20240310.csv"), headers=OASIS_HEADERS)
    source = PRICE_SOURCES["caiso-prices"](make_ctx(server))
    frame = source.read(["US-CAL-CISO"], SPRING, SPRING + timedelta(hours=22))
    assert len(frame) == 23 and set(frame["unit"]) == {"usd_per_mwh"}
    assert set(frame["kind"]) == {"power_price"} and set(frame["key"]) == {"US-CAL-CISO"}
    assert (frame["value"] < 0).sum() == 5 and frame["value"].min() == pytest.approx(-14.8)
    assert (frame["valid_until"] - frame["time"] == pd.Timedelta(hours=1)).all()
    (call,) = http.calls
    assert "node=TH_NP15_GEN-APND" in call.request.url and "market_run_id=DAM" in call.request.url
    assert "startdatetime=20240310T08:00-0000" in call.request.url


def test_nyiso_spring_forward_day(http: responses.RequestsMock, server: FixtureServer) -> None:
    http.get(NYISO_DAM, body=recorded("nyiso_damlbmp_zone_20240310.csv"))
    start = datetime(2024, 3, 10, 5, tzinfo=UTC)  # Eastern midnight
    frame = PRICE_SOURCES["nyiso-prices"](make_ctx(server)).read(
        ["US-NY-NYIS"], start, start + timedelta(hours=22)
    )
    assert len(frame) == 23  # 02:00 EST does not exist
    assert (frame["time"].diff().dropna() == pd.Timedelta(hours=1)).all()
    assert frame["time"].iloc[2] == pd.Timestamp("2024-03-10T07:00Z")  # 03:00 EDT
    assert frame["value"].min() == pytest.approx(-6.1)  # N.Y.C., not CAPITL's -10.1


def test_pjm_day_ahead_prices_through_data_miner(
    http: responses.RequestsMock, server: FixtureServer, caplog: pytest.LogCaptureFixture
) -> None:
    http.add_callback(responses.GET, PJM_LMPS, callback=data_miner("pjm_da_hrl_lmps_20240310.json"))
    http.add_callback(responses.GET, PJM_PNODES, callback=data_miner("pjm_pnode.json"))
    caplog.set_level(logging.INFO, logger="gridstatus")
    start = datetime(2024, 3, 10, 5, tzinfo=UTC)  # Eastern midnight
    ctx = make_ctx(server, creds={**CREDS, "PJM_API_KEY": PJM_KEY})
    frame = PRICE_SOURCES["pjm-prices"](ctx).read(
        ["US-MIDA-PJM"], start, start + timedelta(hours=22)
    )
    assert len(frame) == 23 and frame["value"].min() == pytest.approx(-3.9)  # Dominion's
    assert frame["time"].iloc[0] == pd.Timestamp("2024-03-10T05:00Z")
    assert PJM_KEY not in caplog.text  # gridstatus logs its request headers
    assert "Ocp-Apim-Subscription-Key" in caplog.text


def test_pjm_throttled_is_unavailable(http: responses.RequestsMock, server: FixtureServer) -> None:
    http.get(PJM_LMPS, status=429)
    ctx = make_ctx(server, creds={**CREDS, "PJM_API_KEY": PJM_KEY})
    waits: list[float] = []
    ctx.sleep = waits.append
    start = datetime(2024, 3, 10, 5, tzinfo=UTC)
    with pytest.raises(SourceUnavailable, match="throttled"):
        PRICE_SOURCES["pjm-prices"](ctx).read(["US-MIDA-PJM"], start, start)
    assert len(waits) == 3


@pytest.fixture
def urls() -> Iterator[RecordedUrls]:
    handler = RecordedUrls({})
    urllib.request.install_opener(urllib.request.build_opener(handler))
    yield handler
    urllib.request.install_opener(None)  # type: ignore[arg-type]


def test_miso_day_ahead_prices_through_urllib(urls: RecordedUrls, server: FixtureServer) -> None:
    urls.bodies[MISO_DAM] = (200, recorded("miso_20240310_da_expost_lmp.csv"))
    start = datetime(2024, 3, 10, 5, tzinfo=UTC)  # MISO's day: Eastern Standard Time, always
    frame = PRICE_SOURCES["miso-prices"](make_ctx(server)).read(
        ["US-MIDW-MISO"], start, start + timedelta(hours=23)
    )
    assert len(frame) == 24 and urls.seen == [MISO_DAM]  # EST has no spring-forward hour
    assert frame["time"].iloc[0] == pd.Timestamp("2024-03-10T05:00Z")
    assert frame["value"].min() == pytest.approx(-5.8)  # MINN.HUB, not ILLINOIS.HUB


def test_miso_server_error_through_urllib_is_unavailable(
    urls: RecordedUrls, server: FixtureServer
) -> None:
    urls.bodies[MISO_DAM] = (502, b"bad gateway")
    ctx = make_ctx(server)
    ctx.sleep = lambda s: None
    start = datetime(2024, 3, 10, 5, tzinfo=UTC)
    with pytest.raises(SourceUnavailable, match="HTTP 502"):
        PRICE_SOURCES["miso-prices"](ctx).read(["US-MIDW-MISO"], start, start)
    assert len(urls.seen) == 4


def test_pjm_needs_its_key(server: FixtureServer) -> None:
    frame, errors = PRICE_SOURCES["pjm-prices"](make_ctx(server)).read_partial(
        ["US-MIDA-PJM"], SPRING, SPRING + timedelta(hours=2)
    )
    assert frame.empty and "PJM_API_KEY" in str(errors["US-MIDA-PJM"])


def test_an_unauthorized_answer_is_auth_failed(
    http: responses.RequestsMock, server: FixtureServer
) -> None:
    http.get(NYISO_DAM, status=401)
    start = datetime(2024, 3, 10, 5, tzinfo=UTC)
    with pytest.raises(AuthFailed, match="HTTP 401"):
        PRICE_SOURCES["nyiso-prices"](make_ctx(server)).read(["US-NY-NYIS"], start, start)


def _lmp_frame(**overrides: object) -> pd.DataFrame:
    start = pd.date_range("2024-03-10T08:00Z", periods=3, freq="1h").tz_convert("US/Pacific")
    frame = pd.DataFrame(
        {
            "Interval Start": start,
            "Interval End": start + pd.Timedelta("1h"),
            "Location": "HUB",
            "LMP": [10.0, -3.0, 5.0],
        }
    )
    for k, v in overrides.items():
        frame[k] = v
    return frame


def test_lmp_frame_validation() -> None:
    rows = lmp_obs(_lmp_frame(LMP=[10.0, math.nan, 5.0]), "HUB", "Z", "x")
    assert math.isnan(rows[1].value) and rows[0].time == datetime(2024, 3, 10, 8, tzinfo=UTC)
    assert lmp_obs(_lmp_frame(), "OTHER", "Z", "x") == []
    with pytest.raises(MalformedResponse, match="finite"):
        lmp_obs(_lmp_frame(LMP=[1.0, math.inf, 2.0]), "HUB", "Z", "x")
    with pytest.raises(MalformedResponse, match="a number"):
        lmp_obs(_lmp_frame(LMP=["1", "n/a", "2"]), "HUB", "Z", "x")
    with pytest.raises(MalformedResponse, match="UTC offset"):
        naive = _lmp_frame()
        naive["Interval Start"] = naive["Interval Start"].dt.tz_localize(None)
        lmp_obs(naive, "HUB", "Z", "x")
    with pytest.raises(MalformedResponse, match="missing"):
        lmp_obs(_lmp_frame().drop(columns=["LMP"]), "HUB", "Z", "x")
    dup = pd.concat([_lmp_frame(), _lmp_frame()])
    with pytest.raises(MalformedResponse, match="repeated"):
        lmp_obs(dup, "HUB", "Z", "x")


def test_curtailment_frame_validation() -> None:
    start = pd.date_range("2024-03-10T08:00Z", periods=2, freq="1h").tz_convert("US/Pacific")
    frame = pd.DataFrame(
        {
            "Interval Start": start.repeat(2),
            "Interval End": (start + pd.Timedelta("1h")).repeat(2),
            "Curtailment MWH": [math.nan, math.nan, 3.0, math.nan],
        }
    )
    rows = curtailment_obs(frame, date(2024, 3, 10), "US/Pacific")
    assert math.isnan(rows[0].value) and rows[1].value == 3.0
    frame["Curtailment MWH"] = [1.0, -2.0, 3.0, 0.0]
    with pytest.raises(MalformedResponse, match=">= 0"):
        curtailment_obs(frame, date(2024, 3, 10), "US/Pacific")


def test_a_missing_library_names_the_extra() -> None:
    with pytest.raises(MissingLibrary, match=r"heliotrope\[grid\]"):
        require("caiso-prices", "gridstatus_not_installed_here", "grid")


def test_a_window_too_long_is_refused_before_any_request(server: FixtureServer) -> None:
    from orchestrator.errors import InputError

    source = PRICE_SOURCES["miso-prices"](make_ctx(server))
    with pytest.raises(InputError, match="at most 400 days"):
        source.read(["US-MIDW-MISO"], SPRING - timedelta(days=500), SPRING)
