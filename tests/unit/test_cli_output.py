"""Output people can read and machines can parse: human times, ETA and deadline verdicts,
ISO times in JSON, markup-free messages, whole policy descriptions, a closed pipe; and
nothing written on a rejected submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.live.commands import jobs_table
from orchestrator.live.world import local_offers
from orchestrator.model import JobSpec, Phase
from orchestrator.state import JobRow, MemoryStateStore

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2024, 4, 2, 6, tzinfo=UTC)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("HELIOTROPE_HOME", str(home))
    return home


def jobs_yaml(path: Path, count: int = 1, **over: object) -> Path:
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
    if count > 1:
        entry["count"] = count
    entry.update(over)
    path.write_text(yaml.safe_dump({"jobs": [entry]}))
    return path


def job(deadline_h: float = 10.0) -> JobSpec:
    return JobSpec(
        id="lm",
        work_gpu_hours=4.0,
        gpus=1,
        start=T0,
        deadline=T0 + timedelta(hours=deadline_h),
        home_region="us-east-1",
        gpu_types=frozenset({"L4"}),
        throughput={"L4": 1.0},
        checkpoint_size_gb=0.01,
        cold_start_h=0.1,
    )


def table(row: JobRow, now: datetime, *, status: str | None = None) -> dict[str, object]:
    store = MemoryStateStore()
    store.submit([job()])
    store.commit([], {"lm": row}, expected_version=0)
    if status:
        store.set_control("lm", status=status)
    [out] = jobs_table(store, offers=local_offers(), now_s=now.timestamp())
    return out


def test_deadline_verdicts() -> None:
    offer = next(o for o in local_offers() if o.region == "us-east-1").id
    deadline = T0 + timedelta(hours=10)
    late = table(
        JobRow(
            phase=Phase.DONE,
            progress_gpu_h=4.0,
            finished_at_s=(deadline + timedelta(hours=3.5)).timestamp(),
        ),
        T0,
    )
    assert late["deadline_status"] == "missed (+3.5 h)" and late["phase"] == "done"
    early = table(
        JobRow(
            phase=Phase.DONE,
            progress_gpu_h=4.0,
            finished_at_s=(deadline - timedelta(hours=1)).timestamp(),
        ),
        T0,
    )
    assert early["deadline_status"] == "met"
    # running, 1 of 4 h done: 3 h to go
    running = JobRow(phase=Phase.RUNNING, offer_id=offer, progress_gpu_h=1.0)
    on_track = table(running, T0 + timedelta(hours=6))
    assert on_track["deadline_status"] == "on track"
    assert on_track["eta"] == (T0 + timedelta(hours=9)).isoformat()
    assert table(running, T0 + timedelta(hours=8))["deadline_status"] == "at risk"
    assert table(running, T0 + timedelta(hours=11))["deadline_status"] == "missed"
    # waiting: a cold start (0.1 h by default) before the work
    waiting = table(JobRow(phase=Phase.WAITING, progress_gpu_h=1.0), T0 + timedelta(hours=6))
    assert waiting["eta"] == (T0 + timedelta(hours=9.1)).isoformat()
    gone = table(JobRow(phase=Phase.WAITING), T0 + timedelta(hours=11), status="cancelled")
    assert gone["deadline_status"] == "cancelled" and gone["phase"] == "cancelled"
    assert gone["eta"] is None


def test_status_and_events_show_human_times_json_stays_iso(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home.mkdir()
    (home / "config.yaml").write_text("signals: scenario\n")
    assert main(["jobs", "submit", str(jobs_yaml(tmp_path / "j.yaml"))]) == 0
    capsys.readouterr()
    assert main(["status"]) == 0
    text = capsys.readouterr().out
    assert "Fleet at 2024-04-02 06:" in text and "2024-04-02 16:00" in text  # the deadline
    assert "+00:00" not in text and "on track" in text
    assert main(["status", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["deadline"] == "2024-04-02T16:00:00+00:00"
    assert datetime.fromisoformat(row["eta"]) < datetime.fromisoformat(row["deadline"])

    assert main(["controller", "run", "--once"]) == 0
    capsys.readouterr()
    assert main(["events", "lm", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert events and datetime.fromisoformat(events[0]["time"]).timestamp() == pytest.approx(
        events[0]["time_s"], abs=0.5
    )
    assert main(["events", "lm"]) == 0
    text = capsys.readouterr().out
    assert events[0]["time"][:16].replace("T", " ") in text
    assert f"{events[0]['time_s']:.3f}" not in text  # no epoch floats for people
    assert main(["jobs", "cancel", "lm"]) == 0


def test_a_rejected_submit_leaves_a_fresh_home_empty_and_prints_the_example_intact(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jobs_yaml(tmp_path / "j.yaml")
    doc = yaml.safe_load(path.read_text())
    del doc["jobs"][0]["command"]
    path.write_text(yaml.safe_dump(doc))
    assert main(["jobs", "submit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "e.g. [python, train.py]" in " ".join(err.split())  # not eaten as rich markup
    assert not home.exists()
    # the replay example wants A100s and has no command: refused, home untouched
    assert main(["jobs", "submit", str(REPO / "docs/examples/demo-jobs.yaml")]) == 2
    assert "local-jobs.yaml" in capsys.readouterr().err
    assert not home.exists()
    wrong_gpu = jobs_yaml(tmp_path / "g.yaml", gpu_types=["H100"], throughput={})
    assert main(["jobs", "submit", str(wrong_gpu)]) == 2
    assert "gpu_types" in capsys.readouterr().err and not home.exists()


def test_table_cells_are_text_not_markup(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import _print_rows

    _print_rows([{"detail": "bad [python, train.py] and [bold]x[/bold]"}], False, "t [x]")
    out = " ".join(capsys.readouterr().out.split())
    assert "[python, train.py]" in out and "[bold]x[/bold]" in out and "t [x]" in out


def test_policies_print_each_description_whole(capsys: pytest.CaptureFixture[str]) -> None:
    from policies.registry import POLICY_NAMES, make_policy

    assert main(["policies"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in POLICY_NAMES:
        first = (type(make_policy(name)).__doc__ or "").strip().split("\n\n")[0]
        assert f"{name} {' '.join(first.split())}" in text


def test_status_json_into_a_closed_pipe_is_quiet(home: Path, tmp_path: Path) -> None:
    assert main(["jobs", "submit", str(jobs_yaml(tmp_path / "j.yaml", count=400))]) == 0
    env = {**os.environ, "HELIOTROPE_HOME": str(home)}
    cli = Path(sys.executable).parent / "heliotrope"
    run = subprocess.run(
        f"'{cli}' status --json | head -1",
        shell=True,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.stdout == "[\n" and "Traceback" not in run.stderr, run.stderr
