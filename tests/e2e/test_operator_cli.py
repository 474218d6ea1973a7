"""The commands an operator reaches for, through the CLI on a fresh local home: cancel,
logs, cost-report, migrate --hold, jobs hold / release."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.checkpoints import CheckpointStore
from orchestrator.cli import main
from orchestrator.live.world import configured_world

COUNT_JOB = Path(__file__).resolve().parent / "count_job.py"
PRINTER = (
    "import time\nfor i in range(100000):\n    print(f'line {i}', flush=True)\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        yaml.safe_dump({"signals": "scenario", "policy": "on-demand", "days": 3, "speed": 60})
    )
    monkeypatch.setenv("HELIOTROPE_HOME", str(home))
    yield tmp_path
    world = configured_world()
    for instance in world.provider.list_instances(cluster=world.cluster):
        world.provider.terminate([instance], request_id=f"cleanup-{instance}")


def submit(tmp_path: Path, command: list[str]) -> None:
    doc = {
        "jobs": [
            {
                "name": "lm",
                "work_gpu_hours": 50.0,
                "gpus": 1,
                "gpu_types": ["L4"],
                "throughput": {"L4": 1.0},
                "start_offset_h": 0,
                "deadline_h": 200,
                "home_region": "us-east-1",
                "checkpoint_size_gb": 0.01,
                "cold_start_h": 0.01,
                "command": command,
            }
        ]
    }
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["jobs", "submit", str(path)]) == 0


def status(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert main(["status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 1
    return rows[0]  # type: ignore[no-any-return]


@pytest.mark.timeout(180)
def test_cancel_stops_the_job_keeps_its_checkpoints_and_it_stays_cancelled(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(
        home,
        [sys.executable, str(COUNT_JOB), "--steps", "100000", "--every", "5", "--sleep-s", "0.01"],
    )
    assert main(["controller", "run", "--once"]) == 0
    row = status(capsys)
    assert row["where"] and row["phase"] in ("starting", "running")
    world = configured_world()
    offer = next(o for o in world.offers if o.id == row["where"])
    checkpoints = CheckpointStore(world.store_uri(offer))
    for _ in range(300):  # until the job has started and checkpointed
        first = checkpoints.latest("lm")
        if first is not None:
            break
        time.sleep(0.1)
    assert first is not None
    assert main(["jobs", "cancel", "lm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stopped"] and out["checkpoint_at"] == row["where"]
    assert world.provider.list_instances(cluster=world.cluster) == {}
    last = checkpoints.latest("lm")
    assert last is not None and last.step >= first.step  # kept, and one more on SIGTERM

    assert main(["controller", "run", "--until-done", "--interval", "60"]) == 0  # ends at once
    row = status(capsys)
    assert row["phase"] == "cancelled" and row["where"] == ""
    assert world.provider.list_instances(cluster=world.cluster) == {}
    assert main(["jobs", "cancel", "lm"]) == 2
    assert "cancelled already" in capsys.readouterr().err
    assert main(["migrate", "lm", "--to", "europe-west4"]) == 2
    assert "cancelled" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_logs_print_and_follow_the_job_output(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(home, [sys.executable, "-c", PRINTER])
    assert main(["logs", "lm"]) == 2
    assert "has not run yet" in capsys.readouterr().err
    assert main(["controller", "run", "--once"]) == 0
    time.sleep(1.0)
    capsys.readouterr()
    assert main(["logs", "lm"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("line 0\nline 1\n")

    from orchestrator.live.commands import logs

    got: list[str] = []
    logs("lm", got.append, follow=True, poll_s=0.1, max_s=1.5)
    text = "".join(got)
    assert text.startswith(first) and len(text.splitlines()) > len(first.splitlines())
    # After a cancel, the last instance's output is still there.
    assert main(["jobs", "cancel", "lm"]) == 0
    capsys.readouterr()
    assert main(["logs", "lm", "--follow"]) == 0  # the job is over: prints and returns
    assert capsys.readouterr().out.startswith(text)


def test_logs_on_clouds_say_where_to_look(home: Path) -> None:
    import dataclasses

    from orchestrator.errors import InputError
    from orchestrator.live.commands import log_file

    local = configured_world()
    clouds = dataclasses.replace(  # a world whose provider is not this machine's
        local, settings=local.settings.model_copy(update={"world": "clouds"}), provider=object()
    )  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"get-console-output.*get-serial-port-output"):
        log_file(clouds, local.open_store(), "lm")


@pytest.mark.timeout(180)
def test_cost_report_per_job_and_place_against_on_demand(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(home, [sys.executable, "-c", PRINTER])
    assert main(["controller", "run", "--once"]) == 0
    time.sleep(2.0)  # 2 s at 60x: two scenario minutes
    assert main(["controller", "run", "--once"]) == 0
    capsys.readouterr()
    assert main(["cost-report", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    row = status(capsys)
    job = report["jobs"][0]
    assert job["usd"] == pytest.approx(row["usd"], abs=1e-3) and job["usd"] > 0
    assert job["kg_co2"] == pytest.approx(row["kg_co2"], abs=1e-3)
    [place] = report["by_place"]
    assert place["market"] == "on_demand" and place["usd"] == pytest.approx(job["usd"], abs=1e-3)
    # on-demand ran on on-demand: the baseline is what it paid, nothing saved
    assert report["fleet"]["on_demand_usd"] == pytest.approx(job["usd"], rel=0.05)
    assert abs(report["fleet"]["saved_pct"]) < 5
    # --since after everything: nothing spent since
    assert main(["cost-report", "--json", "--since", "2099-01-01T00:00:00Z"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet"]["usd"] == 0.0
    assert main(["cost-report"]) == 0
    text = capsys.readouterr().out
    assert "less than on-demand" in text and "By region and market" in text


@pytest.mark.timeout(180)
def test_migrate_hold_then_release(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    submit(home, [sys.executable, "-c", PRINTER])
    assert main(["controller", "run", "--once"]) == 0
    capsys.readouterr()
    assert main(["migrate", "lm", "--to", "europe-west4", "--hold", "6", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["started"] and plan["held_until"]
    assert status(capsys)["held_until"] == plan["held_until"]
    assert main(["jobs", "release", "lm"]) == 0
    assert "released lm" in capsys.readouterr().out
    assert status(capsys)["held_until"] is None
    assert main(["jobs", "hold", "lm"]) == 0
    assert "until released" in capsys.readouterr().out
    assert status(capsys)["held_until"] == "until released"
    assert main(["jobs", "hold", "lm", "--hours", "-1"]) == 2
    assert "--hours" in capsys.readouterr().err
