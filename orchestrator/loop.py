"""One tick of the control loop: observe -> snapshot -> policy -> plan -> act -> record.

`Controller.tick(now)` is the only loop there is: replay drives it with a fake clock and
the simulated provider, the live controller and Airflow with real ones. Per tick it

1. accrues dollars, energy, carbon and progress since the previous tick (`accounting`);
2. copies outside state in: preemptions and other provider events;
3. freezes a `Snapshot` and asks the policy for a `Decision`;
4. plans actions against the actual fleet (`planner`, pure) and executes them
   (`executor`, idempotent by request id);
5. applies the resulting events to the fleet and records them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import numpy as np

from orchestrator.accounting import SignalRow, accrue
from orchestrator.clock import utc
from orchestrator.executor import LaunchEnv, Mover, execute
from orchestrator.model import (
    CostSettings,
    Event,
    EventKind,
    FleetState,
    InstanceId,
    JobSpec,
    Market,
    Phase,
    Snapshot,
)
from orchestrator.planner import plan
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.history import SignalHistory
from policies.base import Policy
from policies.costs import JobOfferFit
from providers.base import ComputeProvider, EventType, ProviderEvent

logger = logging.getLogger(__name__)


class EventSink(Protocol):
    def record(self, events: Sequence[Event]) -> None: ...


class EventLog:
    """An in-memory event sink (replay, tests)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def record(self, events: Sequence[Event]) -> None:
        self.events.extend(events)


@dataclasses.dataclass(frozen=True, slots=True)
class LoopOptions:
    cluster: str = "heliotrope"
    settings: CostSettings = dataclasses.field(default_factory=CostSettings)
    # Live jobs report their own progress and completion (provider PROGRESS / COMPLETED
    # events); replay models it from throughput. Costs and energy are accrued either way.
    progress_from_provider: bool = False
    # Environment and command for launched jobs (live providers run them).
    entrypoint: tuple[str, ...] = ()


class Controller:
    """Holds the fleet between ticks. Not thread-safe: one controller per fleet."""

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        grid: SignalGrid,
        provider: ComputeProvider,
        policy: Policy,
        sink: EventSink,
        options: LoopOptions | None = None,
        *,
        mover: Mover | None = None,
        launch_env: LaunchEnv | None = None,
    ) -> None:
        self.jobs = tuple(jobs)
        self.grid = grid
        self.provider = provider
        self.policy = policy
        self.sink = sink
        self.options = options or LoopOptions()
        self.mover = mover
        self.launch_env = launch_env
        self.fleet = FleetState.empty(len(self.jobs))
        self.fit = JobOfferFit.build(self.jobs, grid.offers)
        self.instance_of: list[InstanceId | None] = [None] * len(self.jobs)
        self._index = {job.id: j for j, job in enumerate(self.jobs)}
        self._offer_ix = {o.id: k for k, o in enumerate(grid.offers)}
        self._work = np.array([job.work_gpu_hours for job in self.jobs])
        self._ckpt_s = np.array([job.checkpoint_interval_h * 3600.0 for job in self.jobs])
        self._start_s = np.array([job.start.timestamp() for job in self.jobs])
        self._spot = np.array([o.market is Market.SPOT for o in grid.offers])
        self._last_s: float | None = None
        self.busy: set[int] = set()  # jobs an external mover is migrating: no new intents
        self.progress_seen_s: dict[int, float] = {}
        self._handlers = {
            EventType.PREEMPTED: self._on_preempted,
            EventType.PROGRESS: self._on_progress,
            EventType.COMPLETED: self._on_completed,
            EventType.FAILED: self._on_failed,
        }
        for name in (
            "usd_per_hour",
            "spot_capacity",
            "carbon_g_per_kwh",
            "carbon_marginal_g_per_kwh",
            "curtailing",
            "carbon_hourly_known",
        ):
            getattr(grid, name).flags.writeable = False

    @property
    def all_done(self) -> bool:
        return bool(np.all(self.fleet.phase == Phase.DONE))

    def tick(self, now: datetime) -> list[Event]:
        now = utc(now)
        now_s = now.timestamp()
        k = self._grid_tick(now_s)
        events: list[Event] = []
        if self._last_s is not None:
            events += self._accrue(self._last_s, now_s)
        events += self._observe(now_s)
        self.fleet.phase[(self.fleet.phase == Phase.PENDING) & (self._start_s <= now_s)] = (
            Phase.WAITING
        )

        snapshot = self._snapshot(now, now_s, k)
        decision = self.policy(snapshot)
        actions, refusals = plan(snapshot, decision, k, busy=self.busy)
        for j, reason in refusals:
            logger.debug("refused intent for %s: %s", self.jobs[j].id, reason)
            events.append(Event(now_s, self.jobs[j].id, EventKind.REJECTED, "", reason))
        for event in execute(
            actions,
            snapshot,
            self.provider,
            self.instance_of,
            cluster=self.options.cluster,
            mover=self.mover,
            launch_env=self.launch_env,
            entrypoint=self.options.entrypoint,
        ):
            events.append(self._apply(event))
        self._last_s = now_s
        if events:
            self.sink.record(events)
        return events

    def restore(
        self, fleet: FleetState, instance_of: Sequence[InstanceId | None], last_s: float | None
    ) -> None:
        """Continue from stored state (a live controller after a restart or a reload)."""
        self.fleet = fleet
        self.instance_of = list(instance_of)
        self._last_s = last_s

    def finish(self, end: datetime) -> list[Event]:
        """Accrue up to `end` without deciding anything (the end of a replay window)."""
        end_s = utc(end).timestamp()
        events = self._accrue(self._last_s, end_s) if self._last_s is not None else []
        self._last_s = end_s
        if events:
            self.sink.record(events)
        return events

    # -- steps ---------------------------------------------------------------------------
    def _grid_tick(self, now_s: float) -> int:
        k = int((now_s - self.grid.start_s + 1e-6) // self.grid.tick_s)
        return min(max(k, 0), self.grid.n_ticks - 1)

    def _accrue(self, t0_s: float, t1_s: float) -> list[Event]:
        k = self._grid_tick(t0_s)
        g = self.grid
        row = SignalRow(
            g.usd_per_hour[k],
            g.carbon_g_per_kwh[k],
            g.carbon_marginal_g_per_kwh[k],
            g.curtailing[k],
        )
        before = self.fleet.progress_gpu_h.copy() if self.mover is not None else None
        done = accrue(
            self.fleet,
            self.fit,
            row,
            self._work,
            self._ckpt_s,
            t0_s,
            t1_s,
            bill_final_tick=self.options.settings.bill_final_tick,
            model_progress=not self.options.progress_from_provider,
        )
        if before is not None:  # live with modelled progress: the mover watches for it
            for j in np.flatnonzero(self.fleet.progress_gpu_h > before):
                self.progress_seen_s[int(j)] = t1_s
        return [
            self._stamp(
                Event(
                    float(self.fleet.finished_at_s[j]),
                    self.jobs[j].id,
                    EventKind.FINISHED,
                    g.offers[self.fleet.offer[j]].id,
                    "work complete",
                ),
                int(j),
            )
            for j in done
        ]

    def _observe(self, now_s: float) -> list[Event]:
        events = []
        for pe in self.provider.poll_events():
            j = self._index.get(pe.job_id)
            if j is None or self.instance_of[j] != pe.instance_id:
                continue  # not one of ours, or an instance we already let go
            handler = self._handlers.get(pe.type)
            if handler is not None:
                event = handler(j, pe, now_s)
                if event is not None:
                    events.append(self._stamp(event, j))
        return events

    def _on_preempted(self, j: int, pe: ProviderEvent, now_s: float) -> Event:
        f = self.fleet
        offer = int(f.offer[j])
        lost = f.progress_gpu_h[j] - f.checkpointed_gpu_h[j]
        f.progress_gpu_h[j] = f.checkpointed_gpu_h[j]
        f.preemptions[j] += 1
        f.preempted_offer[j] = offer
        self._release(j)
        return Event(
            now_s,
            self.jobs[j].id,
            EventKind.PREEMPTED,
            self.grid.offers[offer].id,
            pe.detail,
            {"lost_gpu_h": float(lost)},
            instance_id=pe.instance_id,
        )

    def _on_progress(self, j: int, pe: ProviderEvent, now_s: float) -> None:
        f = self.fleet
        f.progress_gpu_h[j] = min(1.0, max(0.0, pe.value)) * self._work[j]
        f.checkpointed_gpu_h[j] = max(f.checkpointed_gpu_h[j], 0.0)
        if f.phase[j] == Phase.STARTING:
            f.phase[j] = Phase.RUNNING
        self.progress_seen_s[j] = now_s

    def _on_completed(self, j: int, pe: ProviderEvent, now_s: float) -> Event:
        f = self.fleet
        offer = int(f.offer[j])
        f.progress_gpu_h[j] = f.checkpointed_gpu_h[j] = self._work[j]
        f.finished_at_s[j] = pe.time_s or now_s
        f.phase[j] = Phase.DONE
        self.instance_of[j] = None
        f.offer[j] = -1
        return Event(
            now_s,
            self.jobs[j].id,
            EventKind.FINISHED,
            self.grid.offers[offer].id,
            "the job exited successfully",
            instance_id=pe.instance_id,
        )

    def _on_failed(self, j: int, pe: ProviderEvent, now_s: float) -> Event:
        offer = int(self.fleet.offer[j])
        self._release(j)
        return Event(
            now_s,
            self.jobs[j].id,
            EventKind.TERMINATED,
            self.grid.offers[offer].id,
            f"failed: {pe.detail[-300:]}",
            instance_id=pe.instance_id,
        )

    def _snapshot(self, now: datetime, now_s: float, k: int) -> Snapshot:
        g = self.grid
        held = self.fleet.offer >= 0
        used = np.bincount(
            self.fleet.offer[held],
            weights=self.fit.instances[held, self.fleet.offer[held]],
            minlength=len(g.offers),
        )
        capacity = np.where(self._spot, g.spot_capacity[k] - used, np.inf)
        capacity.flags.writeable = False
        return Snapshot(
            now=now,
            now_s=now_s,
            tick_h=g.tick_s / 3600.0,
            offers=g.offers,
            usd_per_hour=g.usd_per_hour[k],
            spot_capacity=capacity,
            carbon_g_per_kwh=g.carbon_g_per_kwh[k],
            carbon_marginal_g_per_kwh=g.carbon_marginal_g_per_kwh[k],
            curtailing=g.curtailing[k],
            jobs=self.jobs,
            fleet=self.fleet.frozen_copy(),
            fit=self.fit,
            settings=self.options.settings,
            history=SignalHistory(g, k),
        )

    def apply(self, event: Event) -> Event:
        """Apply an event produced outside the tick (a live migration's launch or stop)."""
        return self._apply(event)

    def _apply(self, event: Event) -> Event:
        j = self._index[event.job_id]
        f = self.fleet
        if event.kind is EventKind.TERMINATED:
            if f.phase[j] != Phase.DONE:
                # A move or pause checkpoints first (executor contract): nothing is lost.
                f.checkpointed_gpu_h[j] = f.progress_gpu_h[j]
            self._release(j)
        elif event.kind is EventKind.LAUNCHED:
            o = self._offer_ix[event.offer_id]
            src = int(f.checkpoint_offer[j])
            if src >= 0 and self.grid.offers[src].zone != self.grid.offers[o].zone:
                f.migrations[j] += 1
            egress = float(event.data.get("egress_usd", 0.0))
            f.egress_usd[j] += egress
            f.usd[j] += egress
            f.offer[j] = o
            f.checkpoint_offer[j] = o
            f.ready_at_s[j] = float(event.data["ready_at_s"])
            f.last_checkpoint_s[j] = np.nan
            f.phase[j] = Phase.STARTING
            f.launches[j] += 1
            self.instance_of[j] = event.instance_id or None
        return self._stamp(event, j)

    def _release(self, j: int) -> None:
        f = self.fleet
        f.offer[j] = -1
        f.ready_at_s[j] = np.nan
        f.last_checkpoint_s[j] = np.nan
        if f.phase[j] != Phase.DONE:
            f.phase[j] = Phase.WAITING
        self.instance_of[j] = None

    def _stamp(self, event: Event, j: int) -> Event:
        """Attach the job's running totals, so a timeline can be cut from events alone."""
        f = self.fleet
        data = {
            **event.data,
            "usd": float(f.usd[j]),
            "kg_co2": float(f.kg_co2[j]),
            "progress_gpu_h": float(f.progress_gpu_h[j]),
        }
        return dataclasses.replace(event, data=data)
