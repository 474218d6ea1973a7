"""The command line, end to end in process: outputs on success, exit 2 and nothing written
on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main

JOBS = """
jobs:
  - name: sweep
    count: 3
    work_gpu_hours: 6
    gpus: 1
    gpu_types: [A100-80GB, L4, V100]
    start_offset_h: 1
    deadline_h: 30
    home_region: us-central1
  - name: big
    work_gpu_hours: 160
    gpus: 8
    gpu_types: [A100-40GB, H100]
    start_offset_h: 0
    deadline_h: 44
    home_region: us-east-1
"""
KEYS = {
    "usd",
    "kg_co2",
    "kg_co2_marginal",
    "curtailed_energy_share",
    "deadlines_met",
    "deadlines_missed",
    "migrations",
    "egress_usd",
}


@pytest.fixture
def jobs_file(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(JOBS)
    return path


def test_replay_writes_results_timeline_and_report(
    tmp_path: Path, jobs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        [
            "replay",
            "--jobs",
            str(jobs_file),
            "--days",
            "2",
            "--out",
            str(out),
            "--policies",
            "on-demand,spot-failover,uniform-progress",
            "--json",
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert set(printed["policies"]) == {"on-demand", "spot-failover", "uniform-progress"}
    for name, row in printed["policies"].items():
        assert set(row) >= KEYS, name
        assert row["deadlines_met"] + row["deadlines_missed"] + row["infeasible"] == 4
    on_demand = printed["policies"]["on-demand"]
    assert on_demand["usd"] > printed["policies"]["spot-failover"]["usd"]
    assert on_demand["migrations"] == 0
    for name in (
        "results.json",
        "timeline.csv",
        "report.html",
        "cost_vs_carbon.png",
        "gantt.png",
        "cumulative_cost.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "results.json").read_text())["policies"] == printed["policies"]


def test_replay_without_policies_runs_heliotrope_beside_the_baselines(
    tmp_path: Path, jobs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a person sees first from an offline replay is our policy against the five
    baselines, the same list the replay DAG runs by default."""
    from orchestrator.replay.service import DEFAULT_POLICIES

    args = ["replay", "--jobs", str(jobs_file), "--days", "2", "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert tuple(printed["policies"]) == DEFAULT_POLICIES
    helio = printed["policies"]["heliotrope"]
    assert helio["deadlines_met"] == 4
    assert helio["usd"] < printed["policies"]["on-demand"]["usd"]


def test_generated_trace_round_trips_through_replay(tmp_path: Path, jobs_file: Path) -> None:
    trace = tmp_path / "trace"
    assert main(["traces", "generate", "--seed", "3", "--days", "2", "--out", str(trace)]) == 0
    assert (trace / "manifest.json").is_file()
    assert (
        main(
            [
                "replay",
                "--traces",
                str(trace),
                "--jobs",
                str(jobs_file),
                "--out",
                str(tmp_path / "out"),
                "--policies",
                "carbon-greedy",
            ]
        )
        == 0
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--policies", "on-demand,cheapest"], "cheapest"),
        (["--carbon-price", "-5"], "--carbon-price"),
        (["--traces", "/nonexistent/trace"], "trace directory"),
        (["--tick-minutes", "0"], "--tick-minutes"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(
    tmp_path: Path, jobs_file: Path, args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["replay", "--jobs", str(jobs_file), "--days", "2", "--out", str(out), *args])
    assert code == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_unknown_policy_lists_the_known_ones(
    tmp_path: Path, jobs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "replay",
                "--jobs",
                str(jobs_file),
                "--policies",
                "magic",
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "uniform-progress" in err and "spot-failover" in err


def test_malformed_jobs_file_names_row_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text(JOBS.replace("gpus: 8", "gpus: eight"))
    out = tmp_path / "out"
    assert main(["replay", "--jobs", str(bad), "--days", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "jobs[1].gpus" in err and str(bad) in err
    assert not out.exists()


def test_home_region_without_an_allowed_offer_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text(JOBS.replace("home_region: us-central1", "home_region: mars-north1"))
    assert main(["replay", "--jobs", str(bad), "--days", "2", "--out", str(tmp_path / "o")]) == 2
    assert "home_region" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--suite", "carbon-year", "--carbon-prices", "abc"], "carbon_prices"),
        (["--suite", "skynomad-h100", "--windows", "2"], "windows"),
        (["--suite", "carbon-year", "--workers", "0"], "workers"),
        (["--suite", "carbon-year", "--spot-loss-per-hour", "-1"], "spot_loss_per_hour"),
    ],
)
def test_bench_bad_options_name_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    out = tmp_path / "bench"
    assert main(["bench", "policies", *args, "--data", str(tmp_path), "--out", str(out)]) == 2
    assert field in capsys.readouterr().err
    assert not out.exists()
