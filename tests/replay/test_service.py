"""The replay service: the entry the CLI and the DAG share (`replay`), the one the live demo
uses with jobs and a grid in memory (`replay_loaded`), and refusals in the caller's words."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import InputError
from orchestrator.jobs import load_jobs
from orchestrator.loop import LoopOptions
from orchestrator.model import CostSettings
from orchestrator.replay.metrics import write_outputs
from orchestrator.replay.runner import Replay, build_grid, feasible_jobs, run_policy
from orchestrator.replay.service import (
    CLI_FIELDS,
    DAG_FIELDS,
    ReplayRequest,
    replay,
    replay_loaded,
)
from orchestrator.signals.scenario import generate
from policies.registry import make_policy

START = datetime(2024, 4, 1, tzinfo=UTC)


@pytest.fixture
def jobs_file(tmp_path: Path) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": "sweep",
                        "count": 2,
                        "work_gpu_hours": 3,
                        "gpus": 1,
                        "gpu_types": ["A100-80GB", "L4"],
                        "start_offset_h": 2,
                        "deadline_h": 30,
                        "home_region": "us-central1",
                    },
                    {
                        "name": "late",
                        "work_gpu_hours": 2,
                        "gpus": 1,
                        "gpu_types": ["L4"],
                        "start_offset_h": 40,
                        "deadline_h": 6,
                        "home_region": "us-central1",
                    },
                ]
            }
        )
    )
    return path


def test_replay_loaded_is_what_the_demo_built_by_hand(tmp_path: Path, jobs_file: Path) -> None:
    """The demo's `_replay` (a `Replay` of `run_policy` per policy at the world's carbon
    price, then `write_outputs`) and `replay_loaded` write the same results.json."""
    trace = generate(3, 2.0, start=START)
    jobs = load_jobs(jobs_file, trace_start=START)
    grid = build_grid(trace, jobs, 600, 3)
    names = ("on-demand", "carbon-greedy")
    extra = {"traces": "built-in scenario", "jobs": "demo"}

    options = LoopOptions(cluster="replay", settings=CostSettings(carbon_usd_per_tonne=50.0))
    by_hand = Replay(
        jobs=jobs,
        grid=grid,
        feasible=feasible_jobs(jobs, grid),
        runs=tuple(run_policy(make_policy(n), jobs, grid, options=options) for n in names),
        carbon_usd_per_tonne=50.0,
        seed=3,
        config={
            "tick_s": grid.tick_s,
            "start": grid.start.isoformat(),
            "end": grid.time_of(grid.n_ticks).isoformat(),  # the report's period says it
        },
    )
    paths = write_outputs(by_hand, tmp_path / "by-hand", extra_config=extra)

    got = replay_loaded(
        jobs, grid, names, tmp_path / "service", carbon_usd_per_tonne=50.0, seed=3, config=extra
    )
    want = json.loads(paths["results"].read_text())
    assert got.results == want
    assert got.replay.carbon_usd_per_tonne == 50.0 and len(got.replay.runs) == 2
    row = want["policies"]["carbon-greedy"]
    assert row["objective_usd"] > row["usd"]  # carbon priced in
    assert json.loads(got.paths["results"].read_text()) == want
    assert got.report.is_file() and got.report.name == "report.html"
    assert want["policies"]["on-demand"]["usd"] > 0


def test_replay_keeps_the_window_and_writes_the_outputs(tmp_path: Path, jobs_file: Path) -> None:
    request = ReplayRequest(
        jobs_file=jobs_file,
        out_dir=tmp_path / "out",
        policies=("on-demand",),
        scenario_days=3.0,
        scenario_start=START,
        anchor=START,
        window=timedelta(days=1.5),
        names=DAG_FIELDS,
    )
    result = replay(request)
    assert result.results["config"]["jobs"] == 2, "the job starting after the window is out"
    assert result.source == "built-in scenario (seed 0, 3 days)"
    assert result.results["config"]["traces"] == result.source
    assert (tmp_path / "out" / "timeline.csv").is_file() and result.report.is_file()


@pytest.mark.parametrize(
    ("change", "cli", "dag"),
    [
        ({"tick_minutes": 0.001}, "--tick-minutes", "tick_minutes"),
        ({"carbon_usd_per_tonne": -1.0}, "--carbon-price", "carbon_price"),
        ({"policies": (" ",)}, "--policies", "policies"),
        ({"scenario_days": 0.0}, "--days", "window_days"),
        ({"keep_until": START}, "--since, --until", "window_start, window_days"),
    ],
)
def test_refusals_name_the_callers_field_and_write_nothing(
    tmp_path: Path, jobs_file: Path, change: dict[str, object], cli: str, dag: str
) -> None:
    for names, field in ((CLI_FIELDS, cli), (DAG_FIELDS, dag)):
        out = tmp_path / field
        base: dict[str, object] = {
            "policies": ("on-demand",),
            "scenario_days": 2.0,
            "scenario_start": START,
            "anchor": START,
        }
        request = ReplayRequest(
            jobs_file=jobs_file,
            out_dir=out,
            names=names,
            **{**base, **change},  # type: ignore[arg-type]
        )
        with pytest.raises(InputError, match=field):
            replay(request)
        assert not out.exists()
