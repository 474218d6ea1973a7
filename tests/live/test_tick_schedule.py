"""The live controller decides when a replay of the same period decides: on the marks of
its interval (every 10 minutes means :00, :10, ...), and a move starts in the tick that
planned it, as a replay's executor launches at once (a local stop and copy finish before
they return, so the chain runs plan -> checkpoint -> copy -> launch in one tick)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from orchestrator.live.controller import LiveController
from orchestrator.model import Event, EventKind, InstanceId, Market
from tests.live.test_signals_drive_decisions import (
    CLUSTER,
    TICK_S,
    BootingSim,
    Run,
    checkpoint,
    make_run,
    poll_carbon,
)
from tests.signals.server import FixtureServer, serve


@pytest.fixture
def server() -> Iterator[FixtureServer]:
    yield from serve()


def test_ticks_land_on_the_interval_marks_and_an_overrun_skips_one() -> None:
    run = make_run("on-demand")
    run.clock.advance(3 * 60 + 20)  # start between two marks: 04:03:20
    start = run.clock.now()
    seen: list[float] = []

    def on_tick(live: LiveController, events: list[Event]) -> None:
        seen.append(run.clock.now().timestamp() - start.timestamp())
        if len(seen) == 2:
            run.clock.advance(TICK_S + 100)  # this tick ran past the next mark

    run.live.run(interval_s=TICK_S, max_ticks=4, on_tick=on_tick)
    first_mark = 10 * 60 - (3 * 60 + 20)  # 04:10 from 04:03:20
    # now, 04:10, (04:20 skipped: the 04:10 tick ran until 04:21:40), 04:30, 04:40
    assert seen == [0.0, first_mark, first_mark + 2 * TICK_S, first_mark + 3 * TICK_S]


class StoppingJobSim(BootingSim):
    """The simulated cloud, where a stopped job writes its checkpoint before it exits (as
    the SDK does on SIGTERM): a stop finishes before `terminate` returns, as locally."""

    run: Run

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        offers = {o.id: o for o in self.run.offers}
        for instance_id in ids:
            info = self.list_instances(cluster=CLUSTER).get(instance_id)
            if info is not None:
                checkpoint(self.run, offers[info.offer_id], 20)
        super().terminate(ids, request_id=request_id)


def test_a_move_launches_its_destination_in_the_tick_that_planned_it(
    server: FixtureServer,
) -> None:
    run = make_run("carbon-greedy", markets=(Market.ON_DEMAND,), cloud_type=StoppingJobSim)
    assert isinstance(run.cloud, StoppingJobSim)
    run.cloud.run = run
    poll_carbon(server, run, {"NL": 300.0, "US-MIDA-PJM": 400.0})
    run.live.tick()
    first = run.where()
    assert first is not None and first.cloud == "gcp"
    for _ in range(2):  # it boots and runs
        run.tick()
    checkpoint(run, first, 10)
    run.clock.advance(TICK_S)
    poll_carbon(server, run, {"NL": 900.0, "US-MIDA-PJM": 400.0})
    decided = run.clock.now().timestamp()
    run.live.tick()

    history = run.store.history("j0")
    planned = [
        e for e in history if e.kind is EventKind.MIGRATION and e.detail.startswith("planned:")
    ]
    assert len(planned) == 1 and planned[0].time_s == decided
    at_decision = [(e.kind, e.offer_id[:3]) for e in history if e.time_s == decided]
    assert (EventKind.TERMINATED, "gcp") in at_decision, at_decision
    assert (EventKind.LAUNCHED, "aws") in at_decision, at_decision
    steps = [e.detail for e in history if e.kind is EventKind.MIGRATION and e.time_s == decided]
    assert "copying -> provisioning" in steps and "provisioning -> restoring" in steps, steps
    where = run.where()
    assert where is not None and where.cloud == "aws"
    # Every phase it went through was committed on the way: the store's record is the
    # migration's phase now, not the plan.
    (record,) = run.store.open_migrations()
    assert record.phase == "restoring"
    run.tick(3)
    assert not run.store.open_migrations()
