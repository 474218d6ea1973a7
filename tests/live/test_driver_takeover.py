"""A controller takeover in the middle of a live migration (a new controller process attaching
to the same store and the same cloud) must not lose what the old one launched: the
destination instance is found and terminated when the move rolls back, and the rollback
instance is found, not reported "not seen" (or leaked)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import timedelta

from orchestrator.checkpoints import CheckpointStore
from orchestrator.clock import FakeClock
from orchestrator.live.commands import ManualMove
from orchestrator.live.controller import LiveController
from orchestrator.live.driver import from_record
from orchestrator.loop import LoopOptions
from orchestrator.migration import Limits, Migration, MigrationPhase
from orchestrator.model import EventKind, InstanceId, JobSpec, Offer
from orchestrator.replay.runner import build_grid
from orchestrator.signals.grid import SignalGrid
from orchestrator.state import StateStore
from policies.registry import make_policy
from providers.base import InstanceInfo, InstanceState
from providers.sim import SimProvider
from tests.conftest import T0, tiny_trace
from tests.state.conftest import Backend

CLUSTER = "takeover"
TICK_S = 600
LIMITS = Limits(provision_timeout_s=900, restore_timeout_s=1200, rollback_timeout_s=3000)


class BootingSim(SimProvider):
    """The simulated cloud, with instances RUNNING once booted (`ready_at_s`)."""

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        now = self._clock.now().timestamp()
        return {
            i: dataclasses.replace(info, state=InstanceState.RUNNING)
            if info.state is InstanceState.BOOTING and now >= info.ready_at_s
            else info
            for i, info in super().list_instances(cluster=cluster).items()
        }


@dataclasses.dataclass
class World:
    backend: Backend
    grid: SignalGrid
    clock: FakeClock
    cloud: BootingSim
    root: str

    def store_uri(self, offer: Offer) -> str:
        return f"{self.root}/{offer.region}"

    def controller(self) -> LiveController:
        """A new controller process: its own store connection, the same cloud. It moves
        one phase a tick (not a move's whole chain in the tick that planned it), so that
        the test can stop it in any phase."""
        live = LiveController(
            store=self.backend.open(),
            provider=self.cloud,
            policy=make_policy("on-demand"),
            grid=self.grid,
            clock=self.clock,
            store_uri=self.store_uri,
            options=LoopOptions(cluster=CLUSTER),
            limits=LIMITS,
        )
        live.start_moves = False
        live.driver.max_phases = 1
        return live

    def tick(self, live: LiveController) -> None:
        self.clock.advance(TICK_S)
        live.tick()

    def live(self) -> dict[InstanceId, InstanceInfo]:
        return dict(self.cloud.list_instances(cluster=CLUSTER))


def make_world(backend: Backend) -> World:
    # A one-hour boot: the destination makes no progress before the restore times out.
    job = JobSpec(
        id="j0",
        work_gpu_hours=30.0,
        gpus=1,
        start=T0,
        deadline=T0 + timedelta(hours=40),
        checkpoint_size_gb=1.0,
        cold_start_h=1.0,
        home_region="us-east-1",
        gpu_types=frozenset({"V100", "A100-80GB"}),
    )
    grid = build_grid(tiny_trace(), [job], TICK_S, 0)
    clock = FakeClock(grid.start)
    backend.clock = clock
    world = World(
        backend,
        grid,
        clock,
        BootingSim(grid, clock, cluster=CLUSTER),
        f"memory://takeover-{uuid.uuid4().hex[:8]}",
    )
    world.backend.open().submit([job])
    return world


def migration(store: StateStore) -> Migration:
    (record,) = store.open_migrations()
    return from_record(record)


def start_move(w: World) -> tuple[LiveController, Offer, Offer]:
    """Controller A runs the job, then moves it across regions until it is in PROVISIONING
    with the destination instance launched (and committed)."""
    a = w.controller()
    a.tick()
    assert a.controller is not None and a.controller.instance_of[0] is not None
    src = w.grid.offers[int(a.controller.fleet.offer[0])]
    dst = next(
        k for k, o in enumerate(w.grid.offers) if o.region != src.region and o.market is src.market
    )
    a.policy = ManualMove(0, dst, "test: move across regions")
    a.controller = None
    w.tick(a)
    a.policy = make_policy("on-demand")
    a.controller = None
    assert migration(a.store).phase is MigrationPhase.PLANNED
    w.tick(a)  # asks the source to checkpoint and stop
    assert migration(a.store).phase is MigrationPhase.CHECKPOINTING
    CheckpointStore(w.store_uri(src)).write(
        "j0", 7, {"model.bin": b"weights"}, now_s=w.clock.now().timestamp()
    )
    w.tick(a)
    assert migration(a.store).phase is MigrationPhase.COPYING
    w.tick(a)  # the copy verified: launch at the destination
    assert migration(a.store).phase is MigrationPhase.PROVISIONING
    return a, src, w.grid.offers[dst]


def drive_to_end(w: World, live: LiveController, max_ticks: int = 40) -> str:
    """Tick `live` until no migration is open; the detail of the closing MIGRATION event
    (its phase change and error)."""
    for _ in range(max_ticks):
        if not live.store.open_migrations():
            break
        w.tick(live)
    assert not live.store.open_migrations(), "the migration did not finish"
    moves = [e.detail for e in live.store.history("j0") if e.kind is EventKind.MIGRATION]
    return moves[-1]


def test_takeover_in_provisioning_then_rollback_terminates_the_destination(
    backend: Backend,
) -> None:
    w = make_world(backend)
    _, src, dst = start_move(w)
    (d,) = [i for i, info in w.live().items() if info.offer_id == dst.id]
    # A dies. B takes over only after the provisioning timeout has passed.
    w.clock.advance(2 * TICK_S)
    b = w.controller()
    w.tick(b)  # B must know D: it is RESTORING on D, not rolling back blind
    m = migration(b.store)
    assert m.phase is MigrationPhase.RESTORING and m.dst_instance_id == d
    closed = drive_to_end(w, b)  # D boots too late: the restore times out, it rolls back
    assert "rolling_back -> failed" in closed and "no progress after restore" in closed
    assert d not in w.live(), "the destination instance leaked"
    history = b.store.history("j0")
    assert [e for e in history if e.kind is EventKind.TERMINATED and e.instance_id == d]
    live = w.live()
    assert len(live) == 1, live  # the job runs at the source again, on one instance
    (r,) = live.values()
    assert r.offer_id == src.id
    assert b.controller is not None and b.controller.instance_of[0] == r.id
    assert "not seen" not in closed


def roll_back(w: World) -> tuple[LiveController, Offer, Migration]:
    """Controller A moves the job until the restore at the destination times out and the
    move rolls back (relaunching at the source)."""
    a, src, _ = start_move(w)
    for _ in range(6):  # A: RESTORING, then the restore times out and it rolls back
        w.tick(a)
        if migration(a.store).phase is MigrationPhase.ROLLING_BACK:
            break
    m = migration(a.store)
    assert m.phase is MigrationPhase.ROLLING_BACK and not m.src_instance_id
    return a, src, m


def test_takeover_in_rollback_finds_the_rollback_instance(backend: Backend) -> None:
    w = make_world(backend)
    _, src, _ = roll_back(w)
    (r,) = [i for i, info in w.live().items() if info.offer_id == src.id]
    # A dies; B takes over after the rollback's whole time has passed.
    w.clock.advance(LIMITS.rollback_timeout_s)
    b = w.controller()
    closed = drive_to_end(w, b)
    assert "rolling_back -> failed" in closed
    assert "not seen" not in closed, closed  # B found R: the job is safe on it
    assert list(w.live()) == [r]
    assert b.controller is not None and b.controller.instance_of[0] == r


def test_a_rollback_instance_that_ran_and_ended_unseen_is_not_launched_again(
    backend: Backend,
) -> None:
    """The relaunch at the source restores, runs and ends (it finished, say) between two
    ticks, never seen running: the move fails with the job safe where it ran, and the
    machine does not launch it a second time (the job would run twice from one checkpoint)."""
    w = make_world(backend)
    a, src, m = roll_back(w)
    assert m.checkpoint_step == 7  # the relaunch restores the moved checkpoint
    (r,) = [i for i, info in w.live().items() if info.offer_id == src.id]
    # R restored step 7, wrote step 9 and ended, all before the next tick.
    CheckpointStore(w.store_uri(src)).write(
        "j0", 9, {"model.bin": b"weights+2"}, now_s=w.clock.now().timestamp()
    )
    w.cloud.terminate([r], request_id="ended")
    closed = drive_to_end(w, a)
    assert "rolling_back -> failed" in closed, closed
    relaunches = [
        e
        for e in a.store.history("j0")
        if e.kind is EventKind.LAUNCHED and "rolling_back" in e.detail
    ]
    assert [e.instance_id for e in relaunches] == [r], relaunches
