"""Published carbon forecasts and spot risk signals reach the trace directory as side
tables (`traces.SIDE_TABLES`), forecasts readable only as of their issue time."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.errors import InputError
from orchestrator.model import SignalKind
from orchestrator.signals.poll import SOURCE_NAMES, poll
from orchestrator.signals.sources.base import make_frame
from orchestrator.signals.sources.clouds import parse_placement_scores
from orchestrator.signals.sources.tracemap import samples_to_rows
from orchestrator.signals.traces import (
    forecasts_as_of,
    read_side_table,
    read_trace,
    write_side_table,
)
from tests.signals.conftest import CREDS, NOW
from tests.signals.server import FixtureServer, Reply, em_zone_handler, recorded

DE = [("aws", "eu-central-1")]


def _poll(
    server: FixtureServer,
    out: Path,
    names: list[str],
    now: pd.Timestamp,
    regions: list[tuple[str, str]] = DE,
) -> None:
    urls = {n: server.url for n in SOURCE_NAMES}
    urls["aws-spot-advisor"] = f"{server.url}/spot-advisor-data.json"
    report = poll(
        names,
        out,
        now=now,
        regions=regions,
        credentials=CREDS,
        base_urls=urls,
        env={},
        sleep=lambda s: None,
    )
    assert report.ok, report.table()


def _revised_forecast(bump: float) -> bytes:
    """The recorded forecast as a later issue revises it: the same hours, `bump` higher."""
    data = json.loads(recorded("em_forecast_DE.json"))
    for point in data["forecast"]:
        point["carbonIntensity"] += bump
    return json.dumps(data).encode()


def test_forecasts_are_kept_per_issue_and_never_seen_before_it(
    server: FixtureServer, tmp_path: Path
) -> None:
    out = tmp_path / "live"
    server.add(r"/carbon-intensity/history$", handler=em_zone_handler("em_history_DE.json"))
    server.add(r"/carbon-intensity/forecast$", handler=em_zone_handler("em_forecast_DE.json"))
    _poll(server, out, ["electricitymaps"], pd.Timestamp(NOW))
    later = pd.Timestamp(NOW) + pd.Timedelta(hours=1)
    server.reset()
    server.add(r"/carbon-intensity/history$", handler=em_zone_handler("em_history_DE.json"))
    server.add(r"/carbon-intensity/forecast$", Reply(200, _revised_forecast(50.0)))
    _poll(server, out, ["electricitymaps"], later)

    forecasts = read_side_table(out, "forecasts")
    assert set(forecasts["issued_at"]) == {pd.Timestamp(NOW), later}
    assert set(forecasts["source"]) == {"electricitymaps"}
    assert set(forecasts["metric"]) == {"carbon_avg_g_per_kwh"}
    assert len(forecasts) == 48  # two issues of the same 24 hours
    assert forecasts_as_of(forecasts, pd.Timestamp(NOW) - pd.Timedelta(seconds=1)).empty
    first = forecasts_as_of(forecasts, pd.Timestamp(NOW) + pd.Timedelta(minutes=59))
    assert len(first) == 24 and (first["issued_at"] == pd.Timestamp(NOW)).all()
    both = forecasts_as_of(forecasts, later)
    # every hour now comes from the later issue, 50 g higher than the first said
    assert len(both) == 24 and (both["issued_at"] == later).all()
    diff = both.set_index("time")["value"] - first.set_index("time")["value"]
    assert diff.eq(50.0).all()
    # the grid table still holds observations only (and the NaN that closes the last one)
    grid = read_trace(out).grid
    assert grid.dropna(subset=["value"])["time"].max() < pd.Timestamp(NOW)


def test_spot_advisor_bands_reach_the_trace(server: FixtureServer, tmp_path: Path) -> None:
    server.add(r"/spot-advisor-data.json$", Reply.file("aws_spot_advisor.json"))
    out = tmp_path / "spot"
    _poll(
        server,
        out,
        ["aws-spot-advisor"],
        pd.Timestamp(NOW),
        regions=[("aws", "us-east-1"), ("aws", "eu-west-1")],
    )
    sig = read_side_table(out, "spot_signals")
    now = sig[sig["time"] == pd.Timestamp(NOW)]
    bands = now[now["metric"] == "interruption_pct_max"]
    assert dict(
        zip(zip(bands["region"], bands["instance_type"], strict=True), bands["value"], strict=True)
    ) == {
        ("us-east-1", "g5.xlarge"): 11.0,
        ("us-east-1", "p3.2xlarge"): 22.0,
        ("eu-west-1", "p3.2xlarge"): 100.0,
    }
    assert set(now["zone"]) == {""} and set(now["source"]) == {"aws-spot-advisor"}
    assert {"savings_pct"} <= set(now["metric"])
    # two days later the band is unknown, not stale
    closed = sig[sig["time"] == pd.Timestamp(NOW) + pd.Timedelta(days=2)]
    assert len(closed) == len(now) and closed["value"].isna().all()


def test_placement_scores_kept_raw_beside_the_capacity_mapping() -> None:
    pages = [json.loads(recorded("aws_placement_scores.json"))]
    rows = parse_placement_scores(pages, "p5.48xlarge", {"use1-az1": "us-east-1a"}, NOW)
    samples = make_frame(rows, SignalKind.SPOT_AVAILABILITY, NOW)
    got = samples_to_rows(samples)
    scores = got.spot_signals[got.spot_signals["metric"] == "placement_score"]
    first = scores[scores["time"] == pd.Timestamp(NOW)]
    assert len(first) == len(rows) and set(first["instance_type"]) == {"p5.48xlarge"}
    assert sorted(first["value"]) == sorted(r.value for r in rows)
    assert scores[scores["time"] == pd.Timestamp(NOW + timedelta(hours=6))]["value"].isna().all()
    assert len(got.spot)  # the capacity mapping is still written


def test_side_table_validation(tmp_path: Path) -> None:
    bad = pd.DataFrame(
        {
            "issued_at": [NOW],
            "time": [NOW],
            "grid_zone": ["DE"],
            "metric": ["carbon_guess"],
            "value": [1.0],
            "source": ["x"],
        }
    )
    with pytest.raises(InputError, match="metric"):
        write_side_table(bad, "forecasts", tmp_path)
    assert not (tmp_path / "forecasts.parquet").exists()
    assert read_side_table(tmp_path, "forecasts").empty  # a trace without one reads as empty
    with pytest.raises(InputError, match="issued_at"):
        write_side_table(bad.drop(columns=["issued_at"]), "forecasts", tmp_path)
    assert math.isnan(float("nan"))
