"""The live control plane end to end on this machine: a real training job (examples/
train_lm.py) run by the local provider, moved across regions through the migration
machine (checkpoint, copy, verify, launch, restore), with the controller replaced by a new
one in the middle of the move, as after a crash."""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.checkpoints import CheckpointStore
from orchestrator.clock import FakeClock
from orchestrator.jobs import parse_jobs
from orchestrator.live.commands import ManualMove, live_controller
from orchestrator.live.world import LiveSettings, local_world
from orchestrator.model import EventKind, Phase
from policies.registry import make_policy

REPO = Path(__file__).resolve().parents[2]
STEPS = 60


def job_doc(start_h: float = 0.0) -> dict[str, object]:
    command = [
        sys.executable,
        str(REPO / "examples" / "train_lm.py"),
        "--steps",
        str(STEPS),
        "--log-every",
        "5",
        "--every-steps",
        "5",
        "--corpus-bytes",
        "20000",
        "--step-sleep-s",
        "0.05",
    ]
    return {
        "jobs": [
            {
                "name": "lm",
                "work_gpu_hours": 2.0,
                "gpus": 1,
                "gpu_types": ["L4"],
                "throughput": {"L4": 1.0},
                "start_offset_h": start_h,
                "deadline_h": 48,
                "home_region": "us-east-1",
                "checkpoint_size_gb": 0.01,
                "cold_start_h": 0.1,
                "command": command,
            }
        ]
    }


def drive(live, clock: FakeClock, until, *, timeout_s: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "the live controller did not get there in time"
        clock.advance(600)
        live.tick()
        time.sleep(0.3)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("crash_in", ["copying", "provisioning", "restoring"])
def test_a_move_survives_a_controller_restart_in_every_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash_in: str
) -> None:
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))
    settings = LiveSettings(days=2, signals="scenario")
    clock = FakeClock(settings.start)
    world = local_world(settings, clock=clock)
    store = world.open_store()
    store.submit(parse_jobs(job_doc(), trace_start=clock.now()))
    live = live_controller(world, store)
    live.reclaim_spot = False  # this test moves the job itself
    # One phase a tick, as on a cloud whose instances take a while to stop: a local move
    # would otherwise run from plan to restoring in the tick that planned it.
    live.driver.max_phases = 1

    def progress() -> float:
        c = live.controller
        return 0.0 if c is None else float(c.fleet.progress_gpu_h[0] / c.jobs[0].work_gpu_hours)

    drive(live, clock, lambda: progress() >= 0.25)
    c = live.controller
    assert c is not None
    src = c.grid.offers[int(c.fleet.offer[0])]
    dst = next(
        k
        for k, o in enumerate(c.grid.offers)
        if o.region != src.region and o.market.value == "on_demand"
    )
    live.policy = ManualMove(0, dst, "test: move across regions")
    live.controller = None
    live.tick()
    assert store.open_migrations(), "the move became a migration"

    # Tick until the migration has just entered `crash_in` (each tick advances it one phase
    # and commits), then drop the controller and start a new one from the store and the disk
    # alone, as after a kill.
    def reached() -> bool:
        assert len(world.provider.list_instances(cluster=settings.cluster)) <= 1
        open_ = store.open_migrations()
        return bool(open_) and open_[0].phase == crash_in

    drive(live, clock, reached)
    # on-demand never moves a running job, so the manual move is the only one.
    live = live_controller(world, store, policy=make_policy("on-demand"))
    live.reclaim_spot = False
    drive(
        live,
        clock,
        lambda: (
            live.controller is not None and live.controller.all_done and not store.open_migrations()
        ),
        timeout_s=150,
    )

    history = store.history("lm")
    phases = [e.detail for e in history if e.kind is EventKind.MIGRATION]
    assert any("-> copying" in p for p in phases)
    assert any("running -> done" in p for p in phases), phases
    assert history[-1].kind in (EventKind.FINISHED, EventKind.TERMINATED, EventKind.MIGRATION)
    finished = [e for e in history if e.kind is EventKind.FINISHED]
    assert len(finished) == 1 and finished[0].offer_id == world.grid.offers[dst].id
    assert live.controller.fleet.phase[0] == Phase.DONE
    assert world.provider.list_instances(cluster=settings.cluster) == {}  # nothing left running
    dst_store = CheckpointStore(world.store_uri(world.grid.offers[dst]))
    ref = dst_store.latest("lm")
    assert ref is not None and ref.step == STEPS
    dst_store.verify(ref)
    assert live.controller.fleet.migrations[0] >= 1
    assert clock.now() - settings.start < timedelta(days=2)
