"""The live CLI over a fresh home: submit, status, a refused and a dry-run migration,
events; bad input exits 2 and changes nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))
    return tmp_path


def jobs_file(tmp_path: Path, **over: object) -> Path:
    entry = {
        "name": "lm",
        "work_gpu_hours": 4.0,
        "gpus": 1,
        "gpu_types": ["L4"],
        "throughput": {"L4": 1.0},
        "start_offset_h": 0,
        "deadline_h": 10,
        "home_region": "us-east-1",
        "command": [sys.executable, "-c", "pass"],
    }
    entry.update(over)
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump({"jobs": [entry]}))
    return path


def test_submit_status_migrate_events(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "submit", str(jobs_file(home))]) == 0
    assert "submitted 1 job(s): lm" in capsys.readouterr().out
    assert main(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["job"] for r in rows] == ["lm"] and rows[0]["phase"] == "pending"

    assert main(["migrate", "lm", "--to", "europe-west4", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["to"].startswith("gcp:europe-west4") and plan["started"] is False
    assert plan["hours_to_finish"] == pytest.approx(0.1 + 4.0, abs=0.01)  # cold start + work

    assert main(["events", "lm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # a dry run changed nothing


def test_a_move_that_misses_the_deadline_is_refused(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "submit", str(jobs_file(home, work_gpu_hours=9.95))]) == 0
    capsys.readouterr()
    assert main(["migrate", "lm", "--to", "eu-north-1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "after the deadline" in err and "--force" in err
    assert main(["migrate", "lm", "--to", "eu-north-1", "--dry-run", "--force"]) == 0


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["migrate", "nope", "--to", "us-east-1"], "JOB"),
        (["migrate", "lm", "--to", "mars-1"], "--to"),
        (["preempt", "lm"], "holds none"),
        (["events", "nope"], "submitted job"),
    ],
)
def test_bad_input_exits_2(
    home: Path, argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["jobs", "submit", str(jobs_file(home))]) == 0
    capsys.readouterr()
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_a_job_without_a_command_is_refused(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jobs_file(home)
    doc = yaml.safe_load(path.read_text())
    del doc["jobs"][0]["command"]
    path.write_text(yaml.safe_dump(doc))
    assert main(["jobs", "submit", str(path)]) == 2
    assert "command" in capsys.readouterr().err
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
