"""Operator controls over a real local job: a hold keeps the job where it runs whatever the
policy wants, until the hold ends or is released; a cancelled job is stopped by whichever
controller ticks next and never placed again."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.checkpoints import CheckpointStore
from orchestrator.clock import FakeClock
from orchestrator.jobs import parse_jobs
from orchestrator.live.commands import hold, live_controller
from orchestrator.live.controller import LiveController
from orchestrator.live.world import LiveSettings, local_world
from orchestrator.model import Decision, EventKind, Intent, Market, Phase
from policies.base import Snapshot

COUNT_JOB = Path(__file__).resolve().parents[1] / "e2e" / "count_job.py"


@dataclass
class Wants:
    """A policy that wants every started job on one offer (the test moves the target)."""

    offer: int
    name: str = "wants"

    def __call__(self, snapshot: Snapshot) -> Decision:
        return Decision(
            {
                j: Intent(self.offer, "test: wants it there")
                for j in range(len(snapshot.jobs))
                if snapshot.fleet.phase[j] not in (Phase.PENDING, Phase.DONE)
            }
        )


def job_doc() -> dict[str, object]:
    return {
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
                "cold_start_h": 0.1,
                "command": [
                    sys.executable,
                    str(COUNT_JOB),
                    "--steps",
                    "100000",
                    "--every",
                    "5",
                    "--sleep-s",
                    "0.01",
                ],
            }
        ]
    }


def drive(
    live: LiveController, clock: FakeClock, until: Callable[[], bool], ticks: int = 40
) -> None:
    for _ in range(ticks):
        if until():
            return
        clock.advance(600)
        live.tick()
        time.sleep(0.2)
    raise AssertionError("the controller did not get there")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))
    settings = LiveSettings(days=3, signals="scenario")
    clock = FakeClock(settings.start)
    w = local_world(settings, clock=clock)
    yield w, clock
    for instance in w.provider.list_instances(cluster=settings.cluster):
        w.provider.terminate([instance], request_id=f"cleanup-{instance}")


def on_demand(world, region: str) -> int:  # type: ignore[no-untyped-def]
    return next(
        k
        for k, o in enumerate(world.grid.offers)
        if o.region == region and o.market is Market.ON_DEMAND
    )


@pytest.mark.timeout(240)
def test_a_held_job_stays_until_released(world) -> None:  # type: ignore[no-untyped-def]
    world, clock = world
    store = world.open_store()
    store.submit(parse_jobs(job_doc(), trace_start=clock.now()))
    east, west = on_demand(world, "us-east-1"), on_demand(world, "europe-west4")
    policy = Wants(east)
    live = live_controller(world, store, policy=policy)
    live.reclaim_spot = False

    def running_on(k: int) -> bool:
        c = live.controller
        return (
            c is not None
            and int(c.fleet.offer[0]) == k
            and not store.open_migrations()
            and c.fleet.phase[0] == Phase.RUNNING
        )

    drive(live, clock, lambda: running_on(east))
    until = hold("lm", None, store=store, now_s=clock.now().timestamp())
    assert math.isinf(until) and store.load()[0].held_until_s == {"lm": math.inf}

    policy.offer = west  # the policy now wants it elsewhere, tick after tick
    before = len(store.history("lm"))
    for _ in range(4):
        clock.advance(600)
        live.tick()
    new = store.history("lm")[before:]
    assert not [
        e for e in new if e.kind in (EventKind.MIGRATION, EventKind.TERMINATED, EventKind.REJECTED)
    ], new
    assert running_on(east)

    # A hold that has ended lets the policy act again.
    hold("lm", 0.5, store=store, now_s=clock.now().timestamp())
    clock.advance(3600)
    live.tick()
    moves = [e for e in store.history("lm") if e.kind is EventKind.MIGRATION]
    assert moves and moves[0].offer_id == world.grid.offers[west].id


@pytest.mark.timeout(240)
def test_a_cancelled_job_is_stopped_by_the_next_tick_and_never_placed_again(
    world,  # type: ignore[no-untyped-def]
) -> None:
    world, clock = world
    store = world.open_store()
    store.submit(parse_jobs(job_doc(), trace_start=clock.now()))
    east = on_demand(world, "us-east-1")
    live = live_controller(world, store, policy=Wants(east))
    live.reclaim_spot = False
    drive(
        live,
        clock,
        lambda: live.controller is not None and live.controller.fleet.phase[0] == Phase.RUNNING,
    )
    time.sleep(1.0)  # a few checkpoints

    # What `jobs cancel` stores first: a running controller (this one) stops the job itself.
    store.set_control("lm", status="cancelled")
    clock.advance(600)
    live.tick()
    assert world.provider.list_instances(cluster=world.cluster) == {}
    stop = [e for e in store.history("lm") if e.kind is EventKind.TERMINATED]
    assert stop and "cancelled" in stop[-1].detail
    for _ in range(3):
        clock.advance(600)
        live.tick()
    assert not [e for e in store.history("lm") if e.kind is EventKind.LAUNCHED][1:]
    assert live.finished  # `controller run --until-done` ends
    checkpoint = store.load()[0].rows["lm"].checkpoint_offer_id
    assert checkpoint == world.grid.offers[east].id
    kept = CheckpointStore(world.store_uri(world.grid.offers[east])).latest("lm")
    assert kept is not None and kept.step > 0  # the checkpoints stay
