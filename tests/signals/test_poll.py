"""poll / record / freshness / download: several sources into one trace directory and the
state store; one failing source never stops the others; stale data becomes unknown."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.errors import InputError, UnknownNameError
from orchestrator.model import SignalKind
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.poll import (
    SAMPLES_FILE,
    SOURCE_NAMES,
    download,
    freshness,
    poll,
    read_samples,
)
from orchestrator.signals.traces import read_trace, write_trace
from orchestrator.state import MemoryStateStore
from tests.conftest import tiny_trace
from tests.signals.conftest import CREDS, NOW
from tests.signals.server import FixtureServer, Reply, em_zone_handler

EU = [("aws", "eu-central-1"), ("aws", "eu-west-2"), ("gcp", "europe-west4")]


def _routes(server: FixtureServer) -> None:
    server.add(r"/carbon-intensity/history$", handler=em_zone_handler("em_history_DE.json"))
    server.add(r"/carbon-intensity/forecast$", handler=em_zone_handler("em_forecast_DE.json"))
    server.add(r"/fw24h$", Reply.file("uk_intensity_fw24h.json"))
    server.add(r"^/intensity/", Reply.file("uk_intensity_range.json"))
    server.add(
        r"/v1/services/6F81-5844-456A/skus$",
        handler=lambda r: Reply.file(
            "gcp_billing_skus_page2.json" if r.q("pageToken") else "gcp_billing_skus_page1.json"
        ),
    )


def _poll(
    server: FixtureServer,
    out: Path | None,
    names: list[str],
    *,
    now: datetime = NOW,
    creds: dict[str, str] | None = None,
    **kw,
):  # type: ignore[no-untyped-def]
    urls = {n: server.url for n in SOURCE_NAMES}
    return poll(
        names,
        out,
        now=now,
        regions=kw.pop("regions", EU),
        credentials=creds or CREDS,
        base_urls=urls,
        env={},
        sleep=lambda s: None,
        **kw,
    )


def test_poll_writes_a_readable_trace_and_reports_each_source(
    server: FixtureServer, tmp_path: Path
) -> None:
    _routes(server)
    server.add(r"^/login$", Reply(401, b"{}"))
    out = tmp_path / "live"
    report = _poll(
        server,
        out,
        ["uk-carbon", "electricitymaps", "gcp-billing", "watttime", "entsoe-prices"],
        creds={k: v for k, v in CREDS.items() if k != "ENTSOE_TOKEN"},
    )
    status = {r.name: r.status for r in report.results}
    assert status == {
        "uk-carbon": "ok",
        "electricitymaps": "ok",
        "gcp-billing": "ok",
        "watttime": "skipped",
        "entsoe-prices": "failed",
    }
    assert "ENTSOE_TOKEN" in report.result("entsoe-prices").errors[0]
    assert not report.ok
    trace = read_trace(out)  # the contract holds
    assert set(trace.grid["grid_zone"]) == {"DE", "GB", "NL"}
    assert set(trace.grid["source"]) == {"electricitymaps", "uk-carbon"}  # forecasts stay out
    assert trace.grid["time"].max() <= pd.Timestamp(NOW + timedelta(hours=2))
    assert len(trace.prices) and len(trace.offers)
    assert set(trace.offers["cloud"]) == {"gcp"}
    assert (trace.offers["zone"] == trace.offers["region"]).all()  # region-level offers
    assert trace.manifest["generator"] == "signals-poll"
    assert {s["name"] for s in trace.manifest["sources"]} == {
        "uk-carbon",
        "electricitymaps",
        "gcp-billing",
    }
    samples = read_samples(out)
    assert "electricitymaps-forecast" in set(samples["source"])  # kept in the log
    assert samples["observed_at"].eq(pd.Timestamp(NOW)).all()


def test_stale_values_become_unknown_in_the_trace(server: FixtureServer, tmp_path: Path) -> None:
    _routes(server)
    out = tmp_path / "live"
    _poll(server, out, ["electricitymaps"], regions=[("aws", "eu-central-1")])
    grid = read_trace(out).grid
    de = grid[grid["grid_zone"] == "DE"].reset_index(drop=True)
    # the null hour is NaN; after the last sample's valid_until the value is NaN
    assert de["value"].isna().sum() == 2
    last = de.iloc[-1]
    assert math.isnan(last["value"]) and last["time"] == pd.Timestamp("2024-03-31T05:00Z")
    trace = read_trace(out)
    gcp = tiny_trace().offers.iloc[[0]].assign(grid_zone="DE")
    prices = tiny_trace().prices.iloc[[0]].assign(time=pd.Timestamp("2024-03-30T00:00Z"))
    trace = type(trace)(
        offers=gcp, prices=prices, spot=trace.spot, grid=trace.grid, manifest=trace.manifest
    )
    g = SignalGrid.build(
        trace, datetime(2024, 3, 31, 3, tzinfo=UTC), datetime(2024, 3, 31, 7, tzinfo=UTC), 3600
    )
    assert g.carbon_hourly_known[:, 0].tolist() == [True, True, False, False]


def test_second_poll_appends_and_keeps_foreign_rows(server: FixtureServer, tmp_path: Path) -> None:
    _routes(server)
    out = tmp_path / "mixed"
    base = tiny_trace()
    write_trace(base, out)
    _poll(server, out, ["uk-carbon"])
    first = read_trace(out)
    assert len(first.prices) == len(base.prices)  # the scenario's rows are kept
    assert set(first.grid["source"]) == {"test", "uk-carbon"}
    n_first = len(read_samples(out))
    _poll(server, out, ["uk-carbon"], now=NOW + timedelta(minutes=30))
    second = read_trace(out)
    assert len(read_samples(out)) > n_first  # new observations of the same times
    uk = second.grid[second.grid["source"] == "uk-carbon"]
    assert uk["time"].is_unique  # rebuilt, not appended twice
    assert set(second.grid["source"]) == {"test", "uk-carbon"}
    assert len(second.offers) == len(base.offers)


def test_store_and_freshness(server: FixtureServer, tmp_path: Path) -> None:
    _routes(server)
    store = MemoryStateStore()
    report = _poll(server, None, ["uk-carbon", "electricitymaps"], store=store)
    assert report.ok and report.out is None
    got = store.samples(
        SignalKind.CARBON,
        ["GB"],
        (NOW - timedelta(days=1)).timestamp(),
        (NOW + timedelta(days=1)).timestamp(),
    )
    assert got and all(s.valid_until is not None for s in got)
    rows = {(r.source, r.key): r for r in freshness(None, store, now=NOW)}
    assert not rows[("uk-carbon", "GB")].stale
    assert rows[("electricitymaps", "DE")].region.startswith("aws:eu-central-1")
    assert ("electricitymaps-forecast", "DE") not in rows  # a forecast is not an observation
    later = {(r.source, r.key): r for r in freshness(None, store, now=NOW + timedelta(hours=3))}
    assert later[("uk-carbon", "GB")].stale and later[("electricitymaps", "DE")].stale


def test_a_crashing_source_does_not_stop_the_others(server: FixtureServer, tmp_path: Path) -> None:
    _routes(server)
    server.add(r"/carbon-intensity/history$", Reply(200, b'{"zone": "DE", "history": "x"}'))
    server.routes.insert(0, server.routes.pop())
    report = _poll(server, tmp_path / "t", ["electricitymaps", "uk-carbon"])
    assert report.result("electricitymaps").status == "failed"
    assert "history" in report.result("electricitymaps").errors[0]
    assert report.result("uk-carbon").status == "ok"
    assert len(read_trace(tmp_path / "t").grid)


def test_unknown_source_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(UnknownNameError, match="signal source"):
        poll(["nope"], tmp_path, now=NOW)


def test_download_backfills_history(server: FixtureServer, tmp_path: Path) -> None:
    server.add(r"/carbon-intensity/past-range$", Reply.file("em_past_range_DE.json"))
    start = datetime(2024, 3, 1, tzinfo=UTC)
    report = download(
        "electricitymaps",
        start,
        start + timedelta(hours=47),
        tmp_path / "h",
        now=NOW,
        regions=[("aws", "eu-central-1")],
        credentials=CREDS,
        base_urls={"electricitymaps": server.url},
        env={},
        sleep=lambda s: None,
    )
    assert report.ok
    grid = read_trace(tmp_path / "h").grid
    assert grid["time"].min() == pd.Timestamp(start) and np.isfinite(grid["value"]).sum() == 48
    with pytest.raises(InputError, match="history endpoint"):
        download("gcp-billing", start, start + timedelta(hours=1), tmp_path / "x", now=NOW)


def test_samples_file_is_beside_the_tables(server: FixtureServer, tmp_path: Path) -> None:
    _routes(server)
    _poll(server, tmp_path / "s", ["uk-carbon"])
    assert (tmp_path / "s" / SAMPLES_FILE).is_file()
    assert (tmp_path / "s" / "manifest.json").is_file()


def test_sql_store_round_trip_and_cli_db(
    server: FixtureServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from orchestrator.cli import main
    from orchestrator.state import open_store

    _routes(server)
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    store = open_store(url)
    _poll(server, None, ["uk-carbon"], store=store)
    _poll(server, None, ["uk-carbon"], store=store)  # the same observations: skipped
    got = store.samples(SignalKind.CARBON, ["GB"], 0, (NOW + timedelta(days=2)).timestamp())
    assert len(got) == len({s.identity() for s in got}) > 40
    assert all(s.observed_at == NOW and s.valid_until is not None for s in got)
    store.close()
    monkeypatch.setenv("HELIOTROPE_UK_CARBON_URL", server.url)
    assert main(["signals", "status", "--db", url, "--now", "2024-03-31T04:05Z", "--json"]) == 0
    import json as _json

    rows = _json.loads(capsys.readouterr().out)
    assert [(r["source"], r["key"], r["stale"]) for r in rows] == [("uk-carbon", "GB", False)]


def test_a_poll_against_failing_servers_stops_at_its_deadline(server: FixtureServer) -> None:
    """Every source answers 500 (and retries); past the poll's deadline the sources not
    started yet are reported, not polled."""
    server.add(r".*", Reply(500, b"oops"))
    ticks = iter(range(0, 10_000, 100))  # each look at the clock: 100 s later
    report = _poll(
        server,
        None,
        ["uk-carbon", "electricitymaps", "gcp-billing", "watttime"],
        deadline_s=150.0,
        monotonic=lambda: float(next(ticks)),
    )
    statuses = {r.name: r.status for r in report.results}
    assert set(statuses.values()) == {"failed"}
    late = [r for r in report.results if any("deadline" in e for e in r.errors)]
    assert late and len(late) < 4
    assert "150 s deadline" in late[0].errors[0]
