"""The tick loop on the simulated provider: hand-worked costs, preemptions, moves, refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from orchestrator import catalog
from orchestrator.model import (
    CostSettings,
    Decision,
    EventKind,
    Intent,
    JobSpec,
    Location,
    Phase,
)
from orchestrator.replay.runner import Replay, run_replay
from policies.base import Snapshot
from tests.conftest import T0, tiny_trace

AWS_OD, AWS_SPOT, GCP_OD, GCP_SPOT = 0, 1, 2, 3  # offer order in tiny_trace's grid


@dataclass(frozen=True)
class Scripted:
    """A real (if simple) policy: `choose(snapshot, j)` returns an offer index, None or ...;
    an intent is emitted only when it differs from what the job holds."""

    choose: Callable[[Snapshot, int], int | None]
    name: str = "scripted"

    def __call__(self, snapshot: Snapshot) -> Decision:
        intents = {}
        for j in range(len(snapshot.jobs)):
            if snapshot.fleet.phase[j] in (Phase.PENDING, Phase.DONE):
                continue
            target = self.choose(snapshot, j)
            if target != snapshot.fleet.offer[j]:
                intents[j] = Intent(target, "scripted")
        return Decision(intents)


def job(name: str = "a", work: float = 10.0, hours: float = 40.0, **kw: object) -> JobSpec:
    args: dict[str, object] = {
        "id": name,
        "work_gpu_hours": work,
        "gpus": 1,
        "start": T0,
        "deadline": T0 + timedelta(hours=hours),
        "checkpoint_size_gb": 10.0,
        "cold_start_h": 0.1,
        "home_region": "us-east-1",
    }
    args.update(kw)
    return JobSpec(**args)  # type: ignore[arg-type]


def replay(policy: Scripted, jobs: list[JobSpec], **trace_kw: object) -> Replay:
    return run_replay(tiny_trace(**trace_kw), jobs, [policy], tick_s=600)  # type: ignore[arg-type]


def kinds(r: Replay) -> list[str]:
    return [e.kind.value for e in r.runs[0].events]


def test_on_demand_job_costs_its_hours_times_price() -> None:
    r = replay(Scripted(lambda s, j: AWS_OD), [job()])
    f = r.runs[0].fleet
    hours = 0.1 + 10.0 / catalog.gpu("V100").relative_throughput  # cold start + work / rate
    assert f.usd[0] == pytest.approx(hours * 3.06)
    assert f.finished_at_s[0] == pytest.approx(T0.timestamp() + hours * 3600)
    power = catalog.instance_power_kw("V100", 1) * catalog.pue("aws")
    assert f.kwh[0] == pytest.approx(power * hours)
    assert f.kg_co2[0] == pytest.approx(power * hours * 400.0 / 1000)
    assert kinds(r) == ["launched", "finished", "terminated"]


def test_final_tick_billed_whole_when_asked() -> None:
    trace = tiny_trace()
    exact = run_replay(trace, [job()], [Scripted(lambda s, j: AWS_OD)], tick_s=600)
    whole = run_replay(
        trace,
        [job()],
        [Scripted(lambda s, j: AWS_OD)],
        tick_s=600,
        settings=CostSettings(bill_final_tick=True),
    )
    hours = 0.1 + 10.0 / catalog.gpu("V100").relative_throughput
    assert whole.runs[0].fleet.usd[0] == pytest.approx(np.ceil(hours * 6) / 6 * 3.06)
    assert whole.runs[0].fleet.usd[0] > exact.runs[0].fleet.usd[0]


def test_preemption_loses_work_since_last_checkpoint() -> None:
    # AWS spot available for 5.5 h, then gone for 3 h; the job checkpoints every 2 h.
    r = replay(
        Scripted(
            lambda s, j: (
                AWS_SPOT if s.spot_capacity[AWS_SPOT] > 0 or s.fleet.offer[j] == AWS_SPOT else None
            )
        ),
        [job(checkpoint_interval_h=2.0)],
        spot_pattern=((0.0, 1.0), (5.5, 0.0), (8.5, 1.0)),
    )
    events = r.runs[0].events
    pre = next(e for e in events if e.kind is EventKind.PREEMPTED)
    assert pre.time_s == pytest.approx(T0.timestamp() + 5.5 * 3600)
    rate = catalog.gpu("V100").relative_throughput
    # Ready at 0.1 h; checkpoints are taken at the first tick boundary at least 2 h after
    # the previous one: 13/6 h and 25/6 h of wall time.
    last_checkpoint_h = 25 / 6
    assert pre.data["lost_gpu_h"] == pytest.approx((5.5 - last_checkpoint_h) * rate)
    assert pre.data["progress_gpu_h"] == pytest.approx((last_checkpoint_h - 0.1) * rate)
    relaunch = [e for e in events if e.kind is EventKind.LAUNCHED]
    assert len(relaunch) == 2 and relaunch[1].time_s == pytest.approx(T0.timestamp() + 8.5 * 3600)
    assert r.runs[0].fleet.preemptions[0] == 1
    assert r.runs[0].fleet.phase[0] == Phase.DONE


@pytest.mark.parametrize(("up_h", "copied"), [(1.0, False), (3.0, True)])
def test_a_preemption_before_the_first_checkpoint_leaves_nothing_to_copy(
    up_h: float, copied: bool
) -> None:
    """AWS spot for `up_h` hours, then on-demand on GCP; checkpoints every 2 h (the first at
    13/6 h). Preempted at 1 h, the job kept nothing: it starts over on GCP, no checkpoint to
    copy (no egress, no migration). Preempted at 3 h, its checkpoint is copied from AWS."""

    def policy(s: Snapshot, j: int) -> int:
        if s.spot_capacity[AWS_SPOT] > 0 or s.fleet.offer[j] == AWS_SPOT:
            return AWS_SPOT
        return GCP_OD

    r = replay(
        Scripted(policy),
        [job(checkpoint_interval_h=2.0)],
        spot_pattern=((0.0, 1.0), (up_h, 0.0)),
    )
    f = r.runs[0].fleet
    assert f.preemptions[0] == 1 and f.phase[0] == Phase.DONE
    src = Location("aws", "us-east-1", "us-east-1a")
    dst = Location("gcp", "europe-west4", "europe-west4-a")
    egress = 10.0 * catalog.egress_usd_per_gb(src, dst)
    assert egress > 0
    assert f.egress_usd[0] == pytest.approx(egress if copied else 0.0)
    assert f.migrations[0] == (1 if copied else 0)
    pre = next(e for e in r.runs[0].events if e.kind is EventKind.PREEMPTED)
    assert (pre.data["progress_gpu_h"] > 0) == copied


def test_move_checkpoints_pays_egress_and_transfer() -> None:
    def policy(s: Snapshot, j: int) -> int:
        return AWS_OD if s.now_s < T0.timestamp() + 2 * 3600 else GCP_OD

    r = replay(Scripted(policy), [job(checkpoint_interval_h=100.0)])
    f = r.runs[0].fleet
    src, dst = (
        Location("aws", "us-east-1", "us-east-1a"),
        Location("gcp", "europe-west4", "europe-west4-a"),
    )
    egress = 10.0 * catalog.egress_usd_per_gb(src, dst)
    assert egress > 0
    assert f.egress_usd[0] == pytest.approx(egress)
    assert f.migrations[0] == 1
    launches = [e for e in r.runs[0].events if e.kind is EventKind.LAUNCHED]
    transfer_h = catalog.transfer_hours(10.0, src, dst)
    assert launches[1].data["ready_at_s"] == pytest.approx(
        T0.timestamp() + 2 * 3600 + (0.1 + transfer_h) * 3600
    )
    # Nothing was lost by the planned move: progress at the move was checkpointed.
    v100 = catalog.gpu("V100").relative_throughput
    a100 = catalog.gpu("A100-80GB").relative_throughput
    done_before_move = 1.9 * v100
    expected_finish_h = 2 + 0.1 + transfer_h + (10.0 - done_before_move) / a100
    assert f.finished_at_s[0] == pytest.approx(T0.timestamp() + expected_finish_h * 3600)
    assert f.usd[0] == pytest.approx(2 * 3.06 + (expected_finish_h - 2) * 5.07 + egress)


def test_two_jobs_cannot_take_the_last_spot_slot() -> None:
    r = replay(Scripted(lambda s, j: AWS_SPOT), [job("a"), job("b")], spot_pattern=((0.0, 1.0),))
    first = [e for e in r.runs[0].events if e.time_s == T0.timestamp()]
    assert [e.kind for e in first].count(EventKind.LAUNCHED) == 1
    assert any(e.kind is EventKind.REJECTED and "capacity" in e.detail for e in first)


def test_disallowed_gpu_is_refused_and_job_waits() -> None:
    v100_only = job("a", gpu_types=frozenset({"V100"}), hours=5)
    r = replay(Scripted(lambda s, j: GCP_OD), [v100_only, job("b", hours=40)])
    a_events = {e.kind for e in r.runs[0].events if e.job_id == "a"}
    assert a_events == {EventKind.REJECTED}
    assert r.runs[0].fleet.phase[0] == Phase.WAITING
    assert r.runs[0].fleet.usd[0] == 0.0
    assert r.runs[0].fleet.phase[1] == Phase.DONE


def test_job_waits_until_its_start() -> None:
    late = job(start=T0 + timedelta(hours=3), hours=40)
    r = replay(Scripted(lambda s, j: AWS_OD), [late])
    launch = next(e for e in r.runs[0].events if e.kind is EventKind.LAUNCHED)
    assert launch.time_s == pytest.approx(T0.timestamp() + 3 * 3600)


def test_time_on_an_offer_whose_price_turns_nan_is_billed_at_on_demand() -> None:
    """20 h on spot whose price disappears ("not sold") after 10 h: the second half is
    billed what the same machine costs on demand, never 0."""
    import numpy as np

    from orchestrator.clock import FakeClock
    from orchestrator.loop import Controller, EventLog
    from orchestrator.model import JobSpec, Market
    from orchestrator.replay.runner import build_grid
    from providers.sim import SimProvider
    from tests.conftest import T0, tiny_trace

    job = JobSpec(
        id="j",
        work_gpu_hours=100.0,
        gpus=1,
        start=T0,
        deadline=T0 + timedelta(hours=300),
        checkpoint_size_gb=0.0,
        cold_start_h=0.0,
        home_region="us-east-1",
        gpu_types=frozenset({"V100"}),
    )
    grid = build_grid(tiny_trace(), [job], 3600, 0)
    spot = next(
        k for k, o in enumerate(grid.offers) if o.market is Market.SPOT and o.gpu_type == "V100"
    )
    od = next(
        k
        for k, o in enumerate(grid.offers)
        if o.market is Market.ON_DEMAND and o.gpu_type == "V100"
    )
    grid.usd_per_hour[10:, spot] = np.nan

    class StayOnSpot:
        name = "stay"

        def __call__(self, snapshot):  # type: ignore[no-untyped-def]
            from orchestrator.model import Decision, Intent

            return Decision({0: Intent(spot, "spot")} if snapshot.fleet.offer[0] < 0 else {})

    clock = FakeClock(grid.start)
    c = Controller([job], grid, SimProvider(grid, clock), StayOnSpot(), EventLog())
    for k in range(20):
        clock.set(grid.time_of(k))
        c.tick(grid.time_of(k))
    c.finish(grid.time_of(20))
    spot_usd = float(grid.usd_per_hour[0, spot])
    od_usd = float(grid.usd_per_hour[0, od])
    assert c.fleet.offer[0] == spot
    assert float(c.fleet.usd[0]) == pytest.approx(10 * spot_usd + 10 * od_usd)


def test_two_launches_of_one_job_in_one_tick_get_two_instances() -> None:
    """Two manual moves in the same grid tick (on-demand, then spot): the second launch has
    its own request id, so the job runs on a new, live instance, not the one just ended."""
    from orchestrator.clock import FakeClock
    from orchestrator.live.commands import ManualMove
    from orchestrator.loop import Controller, EventLog
    from orchestrator.model import EventKind, JobSpec, Market
    from orchestrator.replay.runner import build_grid
    from providers.base import InstanceState
    from providers.sim import SimProvider
    from tests.conftest import T0, tiny_trace

    job = JobSpec(
        id="j",
        work_gpu_hours=10.0,
        gpus=1,
        start=T0,
        deadline=T0 + timedelta(hours=100),
        checkpoint_size_gb=0.0,
        cold_start_h=0.0,
        home_region="us-east-1",
        gpu_types=frozenset({"V100"}),
    )
    grid = build_grid(tiny_trace(), [job], 3600, 0)
    od = next(k for k, o in enumerate(grid.offers) if o.market is Market.ON_DEMAND)
    spot = next(k for k, o in enumerate(grid.offers) if o.market is Market.SPOT)
    clock = FakeClock(grid.start)
    provider = SimProvider(grid, clock, cluster="heliotrope")
    c = Controller([job], grid, provider, ManualMove(0, od, "first"), EventLog())
    now = grid.time_of(1)
    clock.set(now)
    c.tick(now)
    c.policy = ManualMove(0, spot, "second")
    c.tick(now)  # the same instant: the same grid tick
    launched = [e for e in c.sink.events if e.kind is EventKind.LAUNCHED]  # type: ignore[attr-defined]
    assert [e.offer_id for e in launched] == [grid.offers[od].id, grid.offers[spot].id]
    assert launched[0].instance_id != launched[1].instance_id
    live = provider.list_instances(cluster=c.options.cluster)
    assert c.instance_of[0] == launched[1].instance_id
    assert live[launched[1].instance_id].state is not InstanceState.TERMINATED


@pytest.mark.parametrize(("kept", "lost"), [(0.25, 2.0), (None, 3.0)])
def test_a_live_preemption_keeps_the_progress_the_job_said_it_checkpointed(
    kept: float | None, lost: float
) -> None:
    """Progress from the job's reports (live): a preemption keeps what its newest reported
    checkpoint holds, and without one reported it keeps nothing."""
    from orchestrator.live.commands import ManualMove
    from providers.base import EventType, ProviderEvent

    spec, grid, clock, cloud, c, _, instance = _live_job_on_demand()
    clock.set(grid.time_of(1))
    at = clock.now().timestamp()
    cloud._events += [
        ProviderEvent(EventType.PROGRESS, instance, spec.id, at, "step 30", 0.75, kept),
        ProviderEvent(EventType.PREEMPTED, instance, spec.id, at, "reclaimed"),
    ]
    c.policy = ManualMove(0, None, "stay idle")
    c.tick(grid.time_of(1))
    pre = next(e for e in c.sink.events if e.kind is EventKind.PREEMPTED)  # type: ignore[attr-defined]
    assert pre.data["lost_gpu_h"] == pytest.approx(lost)
    assert float(c.fleet.progress_gpu_h[0]) == pytest.approx(3.0 - lost)


@pytest.mark.parametrize("exit_after_s", [150.0, 600.0])
def test_a_live_job_that_says_when_it_exited_is_charged_until_then(exit_after_s: float) -> None:
    """A live job's completion comes from its provider, at the next tick; where the provider
    says when it exited (the local provider does), the job is charged until then, as a
    replay charges a job until it finishes, not for the rest of the tick."""
    from orchestrator.live.commands import ManualMove
    from providers.base import EventType, ProviderEvent

    spec, grid, clock, cloud, c, od, instance = _live_job_on_demand()
    clock.set(grid.time_of(1))
    c.policy = ManualMove(0, od, "stay")
    c.tick(grid.time_of(1))
    usd_1, kg_1 = float(c.fleet.usd[0]), float(c.fleet.kg_co2[0])
    clock.set(grid.time_of(2))
    exited = grid.time_of(1).timestamp() + exit_after_s
    cloud._events += [ProviderEvent(EventType.COMPLETED, instance, spec.id, exited, "exit 0")]
    c.tick(grid.time_of(2))
    share = exit_after_s / 600.0  # of the second interval, charged at the rate of the first
    assert float(c.fleet.usd[0]) == pytest.approx(usd_1 * (1 + share))
    assert float(c.fleet.kg_co2[0]) == pytest.approx(kg_1 * (1 + share), rel=0.05)
    assert float(c.fleet.finished_at_s[0]) == exited


def _live_job_on_demand() -> tuple[Any, Any, Any, Any, Any, int, str]:
    """A live controller (progress from the provider) whose one job runs on on-demand after
    the first tick: (spec, grid, clock, provider, controller, offer, instance)."""
    from orchestrator.clock import FakeClock
    from orchestrator.live.commands import ManualMove
    from orchestrator.loop import Controller, EventLog, LoopOptions
    from orchestrator.model import Market
    from orchestrator.replay.runner import build_grid
    from providers.sim import SimProvider

    spec = job(work_gpu_hours=4.0)
    grid = build_grid(tiny_trace(), [spec], 600, 0)
    od = next(k for k, o in enumerate(grid.offers) if o.market is Market.ON_DEMAND)
    clock = FakeClock(grid.start)
    cloud = SimProvider(grid, clock, cluster="live")
    c = Controller(
        [spec],
        grid,
        cloud,
        ManualMove(0, od, "run here"),
        EventLog(),
        LoopOptions(cluster="live", progress_from_provider=True),
    )
    c.tick(grid.time_of(0))
    instance = c.instance_of[0]
    assert instance is not None
    return spec, grid, clock, cloud, c, od, instance
