"""The jobs file: valid files become JobSpecs; each kind of mistake names its field and fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.errors import InputError
from orchestrator.jobs import load_jobs, parse_jobs

REPO = Path(__file__).resolve().parents[2]
START = datetime(2024, 4, 1, tzinfo=UTC)


def one(**fields: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "name": "a",
        "work_gpu_hours": 10,
        "start": "2024-04-01T00:00Z",
        "deadline_h": 24,
        "home_region": "us-east-1",
    }
    entry.update(fields)
    return {"jobs": [entry]}


def test_defaults_offsets_and_count() -> None:
    specs = parse_jobs(
        {
            "defaults": {"gpus": 8, "cold_start_h": 0.2},
            "jobs": [
                {
                    "name": "x",
                    "work_gpu_hours": 80,
                    "start_offset_h": 6,
                    "deadline_h": 48,
                    "home_region": "us-east-1",
                    "count": 3,
                    "gpu_types": ["a100", "h100-80gb"],
                }
            ],
        },
        trace_start=START,
    )
    assert [s.id for s in specs] == ["x-000", "x-001", "x-002"]
    assert specs[0].gpus == 8 and specs[0].cold_start_h == 0.2
    assert specs[0].start == START + timedelta(hours=6)
    assert specs[0].deadline == START + timedelta(hours=54)
    assert specs[0].gpu_types == frozenset({"A100-40GB", "H100"})


@pytest.mark.parametrize(
    ("doc", "field", "words"),
    [
        (one(work_gpu_hours=-1), "jobs[0].work_gpu_hours", "greater than 0"),
        (
            one(deadline="2024-03-01T00:00Z", deadline_h=None),
            "jobs[0].deadline",
            "after the job's start",
        ),
        (one(gpu_types=["Z80"]), "jobs[0].gpu_types", "known GPU types"),
        (one(colour="red"), "jobs[0].colour", "remove it"),
        (one(home_region=None), "jobs[0].home_region", "Field required"),
        (one(start_offset_h=3), "jobs[0]", "exactly one of `start`"),
        ({"jobs": []}, "jobs", "at least 1"),
        (one(launcher="mpirun"), "jobs[0].launcher", "'torchrun' or 'none'"),
        ({"jobs": [one()["jobs"][0], one()["jobs"][0]]}, "jobs[1].name", "unique"),  # type: ignore[index]
    ],
)
def test_bad_entries_name_the_field(doc: dict[str, object], field: str, words: str) -> None:
    doc = {"jobs": [{k: v for k, v in e.items() if v is not None} for e in doc["jobs"]]}  # type: ignore[attr-defined]
    with pytest.raises(InputError) as info:
        parse_jobs(doc, where="jobs.yaml")
    message = str(info.value)
    assert message.startswith("jobs.yaml: ")
    assert field in message and words in message


def test_a_job_may_run_as_is_instead_of_under_torchrun() -> None:
    """`launcher: none` in the jobs file reaches the provider's launch spec."""
    import dataclasses

    from orchestrator.clock import FakeClock
    from orchestrator.loop import Controller, EventLog, LoopOptions
    from orchestrator.replay.runner import build_grid
    from policies.registry import make_policy
    from providers.base import Launcher, LaunchOutcome, LaunchSpec
    from providers.sim import SimProvider
    from tests.conftest import tiny_trace

    (plain,) = parse_jobs(one(), where="jobs.yaml", trace_start=START)
    (as_is,) = parse_jobs(one(launcher="none"), where="jobs.yaml", trace_start=START)
    assert plain.launcher == "torchrun" and as_is.launcher == "none"

    class Recording(SimProvider):
        specs: list[LaunchSpec]

        def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
            self.specs.append(spec)
            return super().launch(spec, request_id=request_id)

    for spec, want in ((plain, Launcher.TORCHRUN), (as_is, Launcher.NONE)):
        grid = build_grid(tiny_trace(), [spec], 600, 0)
        job = dataclasses.replace(spec, start=grid.start, deadline=grid.start + timedelta(days=2))
        clock = FakeClock(grid.start)
        cloud = Recording(grid, clock, cluster="t")
        cloud.specs = []
        policy = make_policy("on-demand")
        Controller([job], grid, cloud, policy, EventLog(), LoopOptions(cluster="t")).tick(
            grid.start
        )
        assert [s.launcher for s in cloud.specs] == [want]


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  - name: a\n    work_gpu_hours: [1,\n")
    with pytest.raises(InputError, match=r"jobs.yaml: line \d+: expected valid YAML"):
        load_jobs(path)


def test_missing_file_points_to_the_docs(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"docs/jobs\.md"):
        load_jobs(tmp_path / "nope.yaml")


@pytest.mark.parametrize("name", ["demo-jobs.yaml", "jobs.yaml"])
def test_documented_examples_parse(name: str) -> None:
    specs = load_jobs(REPO / "docs" / "examples" / name, trace_start=START)
    assert specs and all(s.deadline > s.start for s in specs)
