"""Completion survives a refused commit and a restart: the local provider repeats a final
event until the controller acknowledges it after committing it."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from orchestrator.clock import FakeClock
from orchestrator.jobs import parse_jobs
from orchestrator.live.commands import live_controller
from orchestrator.live.world import LiveSettings, local_world
from orchestrator.model import Event, EventKind, Phase
from orchestrator.state import JobRow, MemoryStateStore, MigrationRecord
from policies.registry import make_policy


class RacedStore(MemoryStateStore):
    """A store where, when `race` is set, another writer commits just before ours (as a
    `heliotrope migrate` or a second controller would): our commit meets a real conflict."""

    race = False

    def commit(
        self,
        events: Sequence[Event],
        rows: Mapping[str, JobRow],
        *,
        expected_version: int,
        migrations: Sequence[MigrationRecord] = (),
        accrued_until_s: float | None = None,
    ) -> int:
        if self.race:
            self.race = False
            super().commit([], {}, expected_version=self.version())
        return super().commit(
            events,
            rows,
            expected_version=expected_version,
            migrations=migrations,
            accrued_until_s=accrued_until_s,
        )


def job_doc(command: list[str]) -> dict[str, object]:
    return {
        "jobs": [
            {
                "name": "quick",
                "work_gpu_hours": 1.0,
                "gpus": 1,
                "gpu_types": ["L4"],
                "throughput": {"L4": 1.0},
                "start_offset_h": 0,
                "deadline_h": 48,
                "home_region": "us-east-1",
                "checkpoint_size_gb": 0.01,
                "cold_start_h": 0.1,
                "command": command,
            }
        ]
    }


@pytest.mark.timeout(60)
def test_a_completion_seen_in_a_refused_tick_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))
    settings = LiveSettings(days=2, signals="scenario")
    clock = FakeClock(settings.start)
    world = local_world(settings, clock=clock)
    store = RacedStore(clock=clock)
    store.submit(parse_jobs(job_doc([sys.executable, "-c", "pass"]), trace_start=clock.now()))
    live = live_controller(world, store, policy=make_policy("on-demand"))
    live.tick()
    assert live.controller is not None and live.controller.instance_of[0] is not None
    local = world.local
    assert local is not None
    deadline = time.monotonic() + 30
    while local.list_instances(cluster=world.cluster) != {}:  # the job exits 0
        assert time.monotonic() < deadline
        time.sleep(0.05)

    # Another writer commits first (a `heliotrope migrate`, a second controller): this
    # tick sees the completion, and its commit is refused.
    store.race = True
    clock.advance(600)
    live.tick()
    assert live.conflicts == 1
    assert store.load()[0].rows["quick"].phase != Phase.DONE

    # A new controller (a restart) is told again, and the job ends DONE, once.
    again = live_controller(world, store, policy=make_policy("on-demand"))
    clock.advance(600)
    again.tick()
    assert store.load()[0].rows["quick"].phase == Phase.DONE
    clock.advance(600)
    again.tick()
    finished = [e for e in store.history("quick") if e.kind is EventKind.FINISHED]
    assert len(finished) == 1
    assert local.poll_events() == []  # acknowledged after the commit


@pytest.mark.timeout(120)
@pytest.mark.parametrize("one_shot", [False, True], ids=["continuous", "one-shot ticks"])
def test_a_job_that_fails_at_start_backs_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_shot: bool
) -> None:
    """A job whose command fails at once is relaunched after 1, 2, 4, 8 ... minutes, not
    every tick; a new controller each tick (Airflow) backs off the same, from the history."""
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))
    settings = LiveSettings(days=2, signals="scenario")
    clock = FakeClock(settings.start)
    world = local_world(settings, clock=clock)
    store = world.open_store()
    store.submit(
        parse_jobs(
            job_doc([sys.executable, "-c", "import sys; sys.exit(3)"]), trace_start=clock.now()
        )
    )
    live = live_controller(world, store, policy=make_policy("on-demand"))
    local = world.local
    assert local is not None
    for _ in range(40):  # 40 minutes, a tick a minute
        if one_shot:
            live = live_controller(world, store, policy=make_policy("on-demand"))
        live.tick()
        deadline = time.monotonic() + 10
        while local.list_instances(cluster=world.cluster):  # let the process fail
            assert time.monotonic() < deadline
            time.sleep(0.02)
        clock.advance(60)
    history = store.history("quick")
    launches = [e for e in history if e.kind is EventKind.LAUNCHED]
    failed = [e for e in history if e.kind is EventKind.TERMINATED]
    # failures at minutes ~1, 3, 6, 11, 20, 37: six launches, not twenty
    assert 4 <= len(launches) <= 7, [e.detail for e in history]
    assert "failure(s) in a row" in failed[-1].detail
    assert any("backing off" in e.detail for e in history if e.kind is EventKind.REJECTED)
