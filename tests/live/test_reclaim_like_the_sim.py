"""A live controller reclaims spot by the replay's rule (providers/sim.py): while an offer
holds more instances than its capacity, the newest launch goes first; the older ones keep
running. (It used to stop every instance there, and only when the capacity was 0, so a
live run and its replay saw different preemptions.)"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import timedelta

from orchestrator.clock import FakeClock
from orchestrator.live.controller import LiveController
from orchestrator.loop import LoopOptions
from orchestrator.model import EventKind, JobSpec, Market
from orchestrator.replay.runner import build_grid
from orchestrator.state import MemoryStateStore
from policies.registry import make_policy
from providers.base import InstanceId, ProviderEvent
from tests.conftest import T0, tiny_trace
from tests.live.test_signals_drive_decisions import BootingSim

TICK_S = 600


class Cloud(BootingSim):
    """The simulated cloud without its own reclaims: the controller's rule is under test."""

    reclaimed: list[str]

    def poll_events(self) -> list[ProviderEvent]:
        events, self._events = self._events, []
        return events

    def preempt(self, instance_id: InstanceId, notice_s: float = 2.0) -> bool:
        info = self.list_instances(cluster="signals").get(instance_id)
        if info is not None:
            self.reclaimed.append(info.job_id)
        return super().preempt(instance_id, notice_s)


def job(i: int) -> JobSpec:
    return JobSpec(
        id=f"j{i}",
        work_gpu_hours=40.0,
        gpus=1,
        start=T0 + timedelta(seconds=i * TICK_S),
        deadline=T0 + timedelta(hours=200),
        checkpoint_size_gb=1.0,
        cold_start_h=0.1,
        home_region="us-east-1",
        gpu_types=frozenset({"V100"}),
    )


def test_capacity_below_what_is_held_reclaims_the_newest_first() -> None:
    jobs = [job(0), job(1), job(2)]
    grid = build_grid(tiny_trace(), jobs, TICK_S, 0)
    spot = [o for o, offer in enumerate(grid.offers) if offer.market is Market.SPOT]
    capacity = grid.spot_capacity.copy()
    capacity[:, spot] = 5.0
    grid = dataclasses.replace(grid, spot_capacity=capacity)
    clock = FakeClock(grid.start)
    store = MemoryStateStore(clock=clock)
    store.submit(jobs)
    cloud = Cloud(grid, clock, cluster="signals")
    cloud.reclaimed = []
    live = LiveController(
        store=store,
        provider=cloud,
        policy=make_policy("spot-failover"),
        grid=grid,
        clock=clock,
        store_uri=lambda o: f"memory://reclaim-{uuid.uuid4().hex[:6]}/{o.region}",
        options=LoopOptions(cluster="signals"),
        reclaim_spot=True,
    )
    for _ in range(4):
        live.tick()
        clock.advance(TICK_S)
    c = live.controller
    assert c is not None
    (o,) = {int(c.fleet.offer[j]) for j in range(3)}  # all three on the cheapest spot
    k = int((clock.now().timestamp() - grid.start_s) // TICK_S)
    capacity.flags.writeable = True  # the loop froze it; the test changes the signal
    capacity[k:, o] = 1.0  # two of the three instances must go
    live.tick()
    assert sorted(cloud.reclaimed) == ["j1", "j2"]  # the two newest
    capacity[k:, o] = 0.0
    clock.advance(TICK_S)
    live.tick()
    assert "j0" in cloud.reclaimed  # none left: the last one goes too
    assert [e for e in store.history("j0") if e.kind is EventKind.LAUNCHED]
