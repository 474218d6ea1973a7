"""End to end: `heliotrope signals poll` against the local fixture server (base URLs from
HELIOTROPE_<SOURCE>_URL), then `heliotrope replay --traces` on what it wrote, then
`signals status` and `traces download`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.signals.traces import read_trace
from tests.signals.conftest import CREDS
from tests.signals.server import FixtureServer, Reply, em_zone_handler

JOBS = """
jobs:
  - name: finetune
    count: 2
    work_gpu_hours: 4
    gpus: 1
    gpu_types: [A100-40GB, A100-80GB, L4]
    start: 2024-03-31T04:00:00Z
    deadline_h: 20
    home_region: us-central1
"""


@pytest.fixture
def live(server: FixtureServer, monkeypatch: pytest.MonkeyPatch) -> FixtureServer:
    server.add(r"/carbon-intensity/history$", handler=em_zone_handler("em_history_DE.json"))
    server.add(r"/carbon-intensity/forecast$", handler=em_zone_handler("em_forecast_DE.json"))
    server.add(r"/carbon-intensity/past-range$", handler=em_zone_handler("em_past_range_DE.json"))
    server.add(r"/fw24h$", Reply.file("uk_intensity_fw24h.json"))
    server.add(r"^/intensity/", Reply.file("uk_intensity_range.json"))
    server.add(
        r"/v1/services/6F81-5844-456A/skus$",
        handler=lambda r: Reply.file(
            "gcp_billing_skus_page2.json" if r.q("pageToken") else "gcp_billing_skus_page1.json"
        ),
    )
    for name in ("ELECTRICITYMAPS", "UK_CARBON", "GCP_BILLING"):
        monkeypatch.setenv(f"HELIOTROPE_{name}_URL", server.url)
    for key in ("ELECTRICITYMAPS_TOKEN", "GCP_BILLING_API_KEY"):
        monkeypatch.setenv(key, CREDS[key])
    return server


def test_poll_then_replay_then_status(
    live: FixtureServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "live"
    argv = [
        "signals",
        "poll",
        "--source",
        "uk-carbon",
        "--source",
        "electricitymaps",
        "--out",
        str(traces),
        "--now",
        "2024-03-31T04:00Z",
    ]
    assert main(argv) == 0
    assert "uk-carbon" in capsys.readouterr().out  # the per-source table
    grid_only = read_trace(traces)
    assert len(grid_only.grid) and grid_only.offers.empty  # carbon alone: no offers yet
    # replay needs prices: add a price source to the same directory
    assert (
        main(
            [
                *argv[:2],
                "--source",
                "gcp-billing",
                "--out",
                str(traces),
                "--now",
                "2024-03-31T04:00Z",
                "--json",
            ]
        )
        == 0
    )
    polled = json.loads(capsys.readouterr().out)
    assert {r["source"]: r["status"] for r in polled["sources"]} == {"gcp-billing": "ok"}
    trace = read_trace(traces)
    assert len(trace.offers) and len(trace.prices) and len(trace.grid)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "replay"
    code = main(
        [
            "replay",
            "--traces",
            str(traces),
            "--jobs",
            str(jobs),
            "--out",
            str(out),
            "--policies",
            "on-demand,carbon-greedy",
            "--tick-minutes",
            "30",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["policies"]) == {"on-demand", "carbon-greedy"}
    assert result["policies"]["on-demand"]["usd"] > 0
    assert (out / "results.json").is_file()

    assert (
        main(["signals", "status", "--out", str(traces), "--now", "2024-03-31T04:10Z", "--json"])
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    by = {(r["source"], r["key"]): r for r in rows}
    assert by[("uk-carbon", "GB")]["stale"] is False
    assert "gcp:europe-west2" in by[("uk-carbon", "GB")]["region"]
    assert any(k[0] == "gcp-billing" for k in by)
    assert (
        main(["signals", "status", "--out", str(traces), "--now", "2024-04-02T04:00Z", "--stale"])
        == 0
    )
    assert "uk-carbon" in capsys.readouterr().out


def test_poll_reports_a_failing_source_with_exit_1(
    live: FixtureServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("ELECTRICITYMAPS_TOKEN")
    code = main(
        [
            "signals",
            "poll",
            "--source",
            "uk-carbon",
            "--source",
            "electricitymaps",
            "--out",
            str(tmp_path / "t"),
            "--now",
            "2024-03-31T04:00Z",
            "--json",
        ]
    )
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    status = {r["source"]: r["status"] for r in report["sources"]}
    assert status == {"uk-carbon": "ok", "electricitymaps": "failed"}
    assert len(read_trace(tmp_path / "t").grid)


def test_traces_download(live: FixtureServer, tmp_path: Path) -> None:
    code = main(
        [
            "traces",
            "download",
            "--source",
            "electricitymaps",
            "--start",
            "2024-03-01T00:00Z",
            "--end",
            "2024-03-02T23:00Z",
            "--region",
            "aws:eu-central-1",
            "--out",
            str(tmp_path / "h"),
        ]
    )
    assert code == 0
    grid = read_trace(tmp_path / "h").grid
    assert grid["grid_zone"].unique().tolist() == ["DE"] and grid["value"].notna().sum() == 48
    assert (
        main(
            [
                "traces",
                "download",
                "--source",
                "gcp-billing",
                "--start",
                "2024-03-01T00:00Z",
                "--end",
                "2024-03-02T00:00Z",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 2
    )


def test_poll_needs_somewhere_to_write(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["signals", "poll", "--source", "uk-carbon"]) == 2
    assert "--out" in capsys.readouterr().err
