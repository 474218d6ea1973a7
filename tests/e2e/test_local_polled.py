"""The local world on the wall clock decides on what `heliotrope signals poll` stored: the
commands a user types, in order. Electricity Maps (a fake on 127.0.0.1, answering in the
recorded shape) says the Swedish grid (SE-SE3, eu-north-1) is at 2,000 g/kWh; without that
sample, its yearly average (about 20 g/kWh) makes it the cleanest local region."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from tests.dags.conftest import stop_instances
from tests.live.test_signals_drive_decisions import em_history
from tests.signals.conftest import CREDS
from tests.signals.server import FixtureServer, em_zone_handler, serve


@pytest.fixture
def server() -> Iterator[FixtureServer]:
    yield from serve()


def place(
    home: Path,
    server: FixtureServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    poll: bool,
) -> tuple[str, str]:
    monkeypatch.setenv("HELIOTROPE_HOME", str(home))
    home.mkdir(parents=True)
    (home / "config.yaml").write_text(yaml.safe_dump({"policy": "carbon-greedy"}))
    jobs = home / "jobs.yaml"
    jobs.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": "lm",
                        "work_gpu_hours": 2.0,
                        "gpus": 1,
                        "gpu_types": ["L4"],
                        "throughput": {"L4": 1.0},
                        "start_offset_h": 0,
                        "deadline_h": 48,
                        "home_region": "us-east-1",
                        "checkpoint_size_gb": 0.01,
                        "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                    }
                ]
            }
        )
    )
    try:
        if poll:
            carbon = {
                "SE-SE3": 2000.0,
                "US-MIDA-PJM": 400.0,
                "NL": 300.0,
                "US-MIDW-MISO": 450.0,
                "US-CENT-SWPP": 450.0,
            }
            server.add(r"/carbon-intensity/history$", handler=em_history(carbon, datetime.now(UTC)))
            server.add(
                r"/carbon-intensity/forecast$", handler=em_zone_handler("em_forecast_DE.json")
            )
            assert (
                main(
                    [
                        "signals",
                        "poll",
                        "--source",
                        "electricitymaps",
                        "--db",
                        f"sqlite:///{home / 'heliotrope.db'}",
                        "--region",
                        "aws:eu-north-1",
                        "--json",
                    ]
                )
                == 0
            ), capsys.readouterr()
        assert main(["jobs", "submit", str(jobs)]) == 0
        assert main(["controller", "run", "--once"]) == 0
        capsys.readouterr()
        assert main(["status", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert main(["explain", "lm"]) == 0
        return str(row["where"]), capsys.readouterr().out
    finally:
        stop_instances(home)


@pytest.mark.timeout(120)
def test_a_polled_carbon_value_decides_where_a_local_job_runs(
    tmp_path: Path,
    server: FixtureServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HELIOTROPE_ELECTRICITYMAPS_URL", server.url)
    monkeypatch.setenv("ELECTRICITYMAPS_TOKEN", CREDS["ELECTRICITYMAPS_TOKEN"])
    where, why = place(tmp_path / "quiet", server, monkeypatch, capsys, poll=False)
    assert where.startswith("aws:eu-north-1"), why  # the yearly prior: Sweden is clean
    assert "prior: yearly average" in why
    where, why = place(tmp_path / "polled", server, monkeypatch, capsys, poll=True)
    assert not where.startswith("aws:eu-north-1"), why  # what was polled: 2,000 g/kWh
    assert where, why
