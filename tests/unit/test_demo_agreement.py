"""The demo says whether its replay agrees with the live run, and says so when it does
not."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from orchestrator.live.demo import _print_agreement, agreement, first_parting, live_totals
from orchestrator.model import Event, EventKind, JobSpec, Phase
from orchestrator.state import JobRow, MemoryStateStore

T0 = datetime(2024, 4, 2, 6, tzinfo=UTC)


def store_with(*finished_h: float) -> MemoryStateStore:
    jobs = [
        JobSpec(
            id=f"j{i}",
            work_gpu_hours=1.0,
            gpus=1,
            start=T0,
            deadline=T0 + timedelta(hours=30),
            home_region="us-east-1",
            checkpoint_size_gb=0.01,
            cold_start_h=0.1,
        )
        for i in range(len(finished_h))
    ]
    store = MemoryStateStore()
    store.submit(jobs)
    store.commit(
        [],
        {
            j.id: JobRow(
                phase=Phase.DONE,
                usd=1.0,
                kg_co2=0.5,
                finished_at_s=(T0 + timedelta(hours=h)).timestamp(),
            )
            for j, h in zip(jobs, finished_h, strict=True)
        },
        expected_version=0,
    )
    return store


def test_live_totals_and_the_difference() -> None:
    live = live_totals(store_with(4.0, 8.0))
    assert live == {"usd": 2.0, "kg_co2": 1.0, "mean_completion_h": pytest.approx(6.0)}
    rows = dict(
        (k, (a, b, rel))
        for k, a, b, rel in agreement(live, {"usd": 2.1, "kg_co2": 1.0, "mean_completion_h": 9.0})
    )
    assert rows["usd"][2] == pytest.approx(0.05)
    assert rows["kg_co2"][2] == 0.0
    assert rows["mean_completion_h"][2] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("replayed", "words"),
    [
        ({"usd": 2.02, "kg_co2": 1.01, "mean_completion_h": 6.1}, "agrees with the live run"),
        (
            {"usd": 3.0, "kg_co2": 1.0, "mean_completion_h": 6.0},
            "does not agree with the live run within 5% on USD",
        ),
    ],
)
def test_the_demo_says_whether_they_agree(replayed: dict[str, float], words: str) -> None:
    console = Console(width=200, record=True)
    _print_agreement(console, store_with(4.0, 8.0), replayed)
    assert words in " ".join(console.export_text().split())


def test_the_replay_runs_each_job_at_the_speed_it_ran_live() -> None:
    """Ready 0.5 h after launch, done 2 h later with 1 GPU-h of progress on a job nominally
    making 1 GPU-h per hour: it ran at 0.5x, and its replay twin does too."""
    from orchestrator.costs import relative_throughput
    from orchestrator.live.demo import _at_speed, measured_speed
    from orchestrator.model import Event, EventKind

    store = store_with(3.0)
    (job,) = store.load()[0].jobs
    job_l4 = dataclasses.replace(job, gpu_types=frozenset({"L4"}), throughput={"L4": 1.0})
    t = T0.timestamp()
    _, version = store.load()
    store.commit(
        [
            Event(t, job.id, EventKind.LAUNCHED, "o", "", {"ready_at_s": t + 1800.0}),
            Event(t + 9000.0, job.id, EventKind.FINISHED, "o", "", {"progress_gpu_h": 1.0}),
        ],
        {},
        expected_version=version,
    )
    speed = measured_speed(store, [job_l4])
    assert speed == {job.id: pytest.approx(0.5)}
    (twin,) = _at_speed([job_l4], speed)
    assert relative_throughput(twin, "L4") == pytest.approx(0.5)
    assert measured_speed(store_with(3.0), [job_l4]) == {job.id: 1.0}  # no launch recorded

    # Ready at once (a local instance): its 0.5 h cold start is the process starting up,
    # which the replay counts as the cold start, so it is not counted as running too.
    slow = dataclasses.replace(job_l4, cold_start_h=0.5)
    ready_at_once = store_with(3.0)
    ready_at_once.commit(
        [
            Event(t, job.id, EventKind.LAUNCHED, "o", "", {"ready_at_s": t + 1.0}),
            Event(t + 9000.0, job.id, EventKind.FINISHED, "o", "", {"progress_gpu_h": 1.0}),
        ],
        {},
        expected_version=ready_at_once.load()[1],
    )
    assert measured_speed(ready_at_once, [slow]) == {job.id: pytest.approx(0.5)}


def launched(at_h: float, job: str, offer: str) -> Event:
    return Event((T0 + timedelta(hours=at_h)).timestamp(), job, EventKind.LAUNCHED, offer, "")


def test_the_demo_names_where_the_runs_first_part() -> None:
    live = [launched(0, "j0", "a:spot"), launched(1.67, "j0", "b:spot"), launched(2, "j1", "c")]
    replay = [launched(0, "j0", "a:spot"), launched(2.5, "j0", "b:spot"), launched(2, "j1", "d")]
    assert first_parting(live, replay) == (
        "They first part at Tue 07:40: the live run launched j0 on b:spot; the replay "
        "launched it at Tue 08:30 on b:spot."
    )
    assert first_parting(live, live) is None
    # Seconds apart are the same decision (a live tick starts a little after its mark).
    late = [dataclasses.replace(e, time_s=e.time_s + 0.1) for e in live]
    assert first_parting(late, live) is None

    console = Console(width=200, record=True)
    _print_agreement(
        console, store_with(4.0, 8.0), {"usd": 3.0, "kg_co2": 1.0, "mean_completion_h": 6.0}, []
    )
    assert "They first part" not in console.export_text()  # no events: nothing to name
