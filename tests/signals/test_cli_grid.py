"""`heliotrope signals poll --source NAME` for each ISO and ENTSO-E source, against recorded
answers at the HTTP layer each client library uses; then `heliotrope replay`-ready tables:
the grid rows of the zone (curtailment or day-ahead price) in the trace it wrote."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main
from orchestrator.signals.traces import read_trace
from tests.signals.conftest import CREDS
from tests.signals.iso_fakes import PJM_KEY, RecordedUrls, serve_iso_days
from tests.signals.server import FixtureServer, Reply

pytest.importorskip("gridstatus")
responses = pytest.importorskip("responses")

# source, --region (or a zone through HELIOTROPE_GRID_ZONES), --now, zone, metric, rows
CASES = [
    (
        "caiso-curtailment",
        "aws:us-west-1",
        "2024-03-11T18:00Z",
        "US-CAL-CISO",
        "curtailment_mw",
        23,
    ),
    (
        "caiso-prices",
        "aws:us-west-1",
        "2024-03-10T12:00Z",
        "US-CAL-CISO",
        "power_price_usd_per_mwh",
        23,
    ),
    (
        "ercot-prices",
        "gcp:us-south1",
        "2024-03-11T12:00Z",
        "US-TEX-ERCO",
        "power_price_usd_per_mwh",
        24,
    ),
    (
        "nyiso-prices",
        "zone:US-NY-NYIS",
        "2024-03-10T12:00Z",
        "US-NY-NYIS",
        "power_price_usd_per_mwh",
        23,
    ),
    (
        "miso-prices",
        "gcp:us-central1",
        "2024-03-10T12:00Z",
        "US-MIDW-MISO",
        "power_price_usd_per_mwh",
        24,
    ),
    (
        "spp-prices",
        "zone:US-CENT-SWPP",
        "2024-03-10T12:00Z",
        "US-CENT-SWPP",
        "power_price_usd_per_mwh",
        23,
    ),
    (
        "isone-prices",
        "zone:US-NE-ISNE",
        "2024-11-04T04:30Z",
        "US-NE-ISNE",
        "power_price_usd_per_mwh",
        24,
    ),  # fall-back day (25 h, hour ending 02X); the first
    # hour starts before the window
    (
        "pjm-prices",
        "aws:us-east-1",
        "2024-03-10T12:00Z",
        "US-MIDA-PJM",
        "power_price_usd_per_mwh",
        23,
    ),
    ("entsoe-prices", "aws:eu-central-1", "2024-03-30T12:00Z", "DE", "power_price_usd_per_mwh", 47),
]


@pytest.fixture
def grid_http(
    server: FixtureServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[responses.RequestsMock]:
    urls = RecordedUrls()
    urllib.request.install_opener(urllib.request.build_opener(urls))
    server.add(
        r"^/$",
        handler=lambda r: Reply.file(
            "entsoe_a75_DE_20240330.xml"
            if r.q("documentType") == "A75"
            else "entsoe_a44_DE_dst.xml"
        ),
    )
    monkeypatch.setenv("HELIOTROPE_ENTSOE_PRICES_URL", server.url)
    monkeypatch.setenv("HELIOTROPE_ENTSOE_GENERATION_URL", server.url)
    monkeypatch.setenv("ENTSOE_TOKEN", CREDS["ENTSOE_TOKEN"])
    monkeypatch.setenv("PJM_API_KEY", PJM_KEY)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add_passthru(server.url)  # entsoe-py's requests go to the 127.0.0.1 server
        serve_iso_days(mock, urls)
        yield mock
    urllib.request.install_opener(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("source", "where", "now", "zone", "metric", "rows"), CASES, ids=[c[0] for c in CASES]
)
def test_signals_poll_each_grid_source(
    grid_http: responses.RequestsMock,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    source: str,
    where: str,
    now: str,
    zone: str,
    metric: str,
    rows: int,
) -> None:
    argv = [
        "signals",
        "poll",
        "--source",
        source,
        "--out",
        str(tmp_path / "t"),
        "--now",
        now,
        "--json",
    ]
    if where.startswith("zone:"):  # no cloud region sits in this ISO
        monkeypatch.setenv("HELIOTROPE_GRID_ZONES", where.removeprefix("zone:"))
        argv += ["--region", "aws:us-east-1"]
    else:
        argv += ["--region", where]
    code = main(argv)
    report = json.loads(capsys.readouterr().out)
    (result,) = report["sources"]
    assert (code, result["status"]) == (0, "ok"), result
    grid = read_trace(tmp_path / "t").grid
    mine = grid[(grid["grid_zone"] == zone) & (grid["metric"] == metric)]
    assert mine["value"].notna().sum() == rows
    assert set(mine["source"]) == {source}
    assert mine["time"].is_monotonic_increasing and mine["time"].is_unique
    real = mine.dropna(subset=["value"])
    assert (real["time"].diff().dropna() == pd.Timedelta(hours=1)).all()  # DST days too
    if metric == "power_price_usd_per_mwh":
        assert (mine["value"] < 0).any()  # negative prices: the curtailment proxy
        # day-ahead: the hour of `now` is priced already
        assert real["time"].max() + pd.Timedelta(hours=1) > pd.Timestamp(now)
    else:
        assert real["time"].max() < pd.Timestamp(now)  # observed: the past only


def test_a_grid_source_without_its_library_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "gridstatus", None)  # as if not installed
    code = main(
        [
            "signals",
            "poll",
            "--source",
            "caiso-prices",
            "--region",
            "aws:us-west-1",
            "--out",
            str(tmp_path / "t"),
            "--now",
            "2024-03-10T12:00Z",
            "--json",
        ]
    )
    (result,) = json.loads(capsys.readouterr().out)["sources"]
    assert code == 1 and result["status"] == "failed"
    assert "heliotrope[grid]" in result["error"]


def test_polled_curtailment_and_negative_prices_reach_the_policy_grid(
    grid_http: responses.RequestsMock, tmp_path: Path
) -> None:
    """What the ISO sources wrote becomes SignalGrid.curtailing for offers in those zones:
    curtailment MW > 0 in CAISO, a negative day-ahead price in PJM."""
    from datetime import UTC, datetime

    from orchestrator.signals.grid import SignalGrid
    from orchestrator.signals.poll import poll
    from tests.conftest import tiny_trace

    out = tmp_path / "live"
    regions = [("aws", "us-west-1"), ("aws", "us-east-1")]
    for names, now in (
        (["caiso-curtailment"], "2024-03-11T18:00Z"),
        (["pjm-prices"], "2024-03-10T12:00Z"),
    ):
        report = poll(
            names, out, now=pd.Timestamp(now).to_pydatetime(), regions=regions, sleep=lambda s: None
        )
        assert report.ok, report.table()
    trace = read_trace(out)
    base = tiny_trace()
    offers = pd.concat(
        [
            base.offers.iloc[[0]],  # aws us-east-1, US-MIDA-PJM
            base.offers.iloc[[0]].assign(
                region="us-west-1", zone="us-west-1a", grid_zone="US-CAL-CISO"
            ),
        ]
    )
    prices = pd.concat(
        [
            base.prices[base.prices["region"] == "us-east-1"],
            base.prices[base.prices["region"] == "us-east-1"].assign(
                region="us-west-1", zone="us-west-1a"
            ),
        ]
    )
    prices = prices.assign(time=pd.Timestamp("2024-03-09T00:00Z"), zone="")
    world = type(trace)(
        offers=offers.reset_index(drop=True),
        prices=prices,
        spot=trace.spot,
        grid=trace.grid,
        manifest=trace.manifest,
    )
    start = datetime(2024, 3, 10, 8, tzinfo=UTC)
    g = SignalGrid.build(world, start, datetime(2024, 3, 11, 4, tzinfo=UTC), 3600)
    col = {o.grid_zone: i for i, o in enumerate(g.offers)}
    hours = pd.date_range(start, periods=g.n_ticks, freq="1h")
    grid = trace.grid
    pjm = grid[(grid["grid_zone"] == "US-MIDA-PJM")].set_index("time")["value"]
    caiso = grid[(grid["grid_zone"] == "US-CAL-CISO")].set_index("time")["value"]
    want_pjm = [bool(pjm.get(h, 1.0) < 0) for h in hours]
    want_caiso = [bool(caiso.get(h, 0.0) > 0) for h in hours]
    assert g.curtailing[:, col["US-MIDA-PJM"]].tolist() == want_pjm and any(want_pjm)
    assert g.curtailing[:, col["US-CAL-CISO"]].tolist() == want_caiso and any(want_caiso)
