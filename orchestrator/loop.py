"""One tick of the control loop: observe -> snapshot -> policy -> plan -> act -> record.

`Controller.tick(now)` is the only loop there is: replay drives it with a fake clock and
the simulated provider, the live controller and Airflow with real ones. Per tick it

1. accrues dollars, energy, carbon and progress since the previous tick (`accounting`), on
   the signals in force at the start of the interval;
2. copies outside state in: preemptions and other provider events, and (when the provider
   lists instances) a reconcile of the fleet against what the provider runs;
3. reads the signals at `now` from its `SignalView` (a precomputed grid in replay, the
   state store's polled samples live), freezes a `Snapshot` and asks the policy for a
   `Decision`; when the view says its signals are stale it holds instead (nothing is
   launched or moved) and records why;
4. plans actions against the actual fleet (`planner`, pure) and executes them
   (`executor`, idempotent by request id);
5. applies the resulting events to the fleet and records them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

import numpy as np

from orchestrator import units
from orchestrator.accounting import SignalRow, accrue, charge
from orchestrator.clock import utc
from orchestrator.costs import JobOfferFit, carbon_usd
from orchestrator.executor import LaunchEnv, Mover, execute
from orchestrator.model import (
    CostSettings,
    Event,
    EventKind,
    FleetState,
    FloatArray,
    InstanceId,
    IntArray,
    JobSpec,
    Market,
    Phase,
)
from orchestrator.planner import plan
from orchestrator.reconcile import reconcile
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.history import SignalHistory
from orchestrator.signals.view import SignalFrame, SignalView, as_view
from policies.base import Policy, Snapshot
from providers.base import ComputeProvider, EventType, ProviderEvent

logger = logging.getLogger(__name__)

FAILURE_BACKOFF_S = 60.0  # the first relaunch after a failed run waits this long, doubling
FAILURE_BACKOFF_MAX_S = units.SECONDS_PER_HOUR  # ... up to this


def failure_backoff_s(failures: int) -> float:
    """How long a job that failed `failures` times in a row waits before its next launch."""
    return min(FAILURE_BACKOFF_MAX_S, FAILURE_BACKOFF_S * 2.0 ** max(0, failures - 1))


# Plain ints and members bound once: the loop reads them per event (enum attribute
# lookups are slow on 3.11).
_PENDING = int(Phase.PENDING)
_WAITING = int(Phase.WAITING)
_STARTING = int(Phase.STARTING)
_DONE = int(Phase.DONE)
_LAUNCHED = EventKind.LAUNCHED
_MIGRATION = EventKind.MIGRATION
_TERMINATED = EventKind.TERMINATED
_REJECTED = EventKind.REJECTED

# A cloud may not list an instance for a while after launching it (eventual consistency):
# reconcile declares a job's instance gone only this long after the launch.
RECONCILE_GRACE_S = 300.0


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
    # Compare the fleet with `provider.list_instances(cluster)` every tick (live): an
    # instance that is gone is a preemption. Replay's simulated provider reports its own.
    reconcile: bool = False


class Controller:
    """Holds the fleet between ticks. Not thread-safe: one controller per fleet."""

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        signals: SignalView | SignalGrid,
        provider: ComputeProvider,
        policy: Policy,
        sink: EventSink,
        options: LoopOptions | None = None,
        *,
        mover: Mover | None = None,
        launch_env: LaunchEnv | None = None,
    ) -> None:
        self.jobs = tuple(jobs)
        self.view = as_view(signals)
        self.offers = self.view.offers
        self._frames: dict[float, SignalFrame] = {}  # the newest two (now, the last tick)
        self.held: str = ""  # why the last tick held (stale signals), "" when it decided
        self.provider = provider
        self.policy = policy
        self.sink = sink
        self.options = options or LoopOptions()
        self.mover = mover
        self.launch_env = launch_env
        self.fleet = FleetState.empty(len(self.jobs))
        self.fit = JobOfferFit.build(self.jobs, self.offers)
        self.instance_of: list[InstanceId | None] = [None] * len(self.jobs)
        self._index = {job.id: j for j, job in enumerate(self.jobs)}
        self._offer_ix = {o.id: k for k, o in enumerate(self.offers)}
        self._offer_ids = [o.id for o in self.offers]
        self._work = np.array([job.work_gpu_hours for job in self.jobs])
        self._ckpt_s = np.array([units.seconds(job.checkpoint_interval_h) for job in self.jobs])
        self._start_s = np.array([job.start.timestamp() for job in self.jobs])
        self._spot = np.array([o.market is Market.SPOT for o in self.offers])
        # Per job: its carbon price (USD/t; its own, else the fleet's) and, per offer, the
        # energy of an hour there (kWh): what a launch's event detail prices.
        self._carbon_usd_per_tonne = self.fit.carbon_prices(
            np.arange(len(self.jobs)), self.options.settings.carbon_usd_per_tonne
        )
        self._kwh = self.fit.power_kw * self.fit.pue
        od = {
            (o.cloud, o.zone, o.instance_type): k
            for k, o in enumerate(self.offers)
            if o.market is Market.ON_DEMAND
        }
        self._on_demand_twin = np.array(
            [od.get((o.cloud, o.zone, o.instance_type), -1) for o in self.offers], dtype=np.int64
        )
        self._last_s: float | None = None
        self._accrued: tuple[float, float, SignalRow] | None = None  # the last interval charged
        self.busy: set[int] = set()  # jobs an external mover is migrating: no new intents
        self.progress_seen_s: dict[int, float] = {}
        self._launched_s: dict[int, float] = {}  # launches of this process, for reconcile
        self.observed: list[ProviderEvent] = []  # what the provider reported this tick
        # job -> (failures in a row, when the last one was): relaunches back off
        self.failed_starts: dict[int, tuple[int, float]] = {}
        self._handlers = {
            EventType.PREEMPTED: self._on_preempted,
            EventType.PROGRESS: self._on_progress,
            EventType.COMPLETED: self._on_completed,
            EventType.FAILED: self._on_failed,
        }

    @property
    def grid(self) -> SignalGrid:
        """The grid of the newest frame (in replay: the whole grid)."""
        return self.frame_at(max(self._frames) if self._frames else 0.0).grid

    def frame_at(self, now_s: float) -> SignalFrame:
        """The view's frame at `now_s`. The newest two are kept: the next tick accrues
        over the interval since this one on the signals of this one."""
        frame = self._frames.get(now_s)
        if frame is None:
            frame = self._frames[now_s] = self.view.frame(now_s)
            for old in sorted(self._frames)[:-2]:
                del self._frames[old]
        return frame

    @property
    def all_done(self) -> bool:
        return bool(np.all(self.fleet.phase == _DONE))

    def tick(self, now: datetime) -> list[Event]:
        now = utc(now)
        now_s = now.timestamp()
        events: list[Event] = []
        if self._last_s is not None:
            events += self._accrue(self._last_s, now_s)
        events += self._observe(now_s)
        self.fleet.phase[(self.fleet.phase == _PENDING) & (self._start_s <= now_s)] = _WAITING
        frame = self.frame_at(now_s)
        k = frame.k
        snapshot = self._snapshot(now, now_s, frame)
        if frame.stale:
            events += self._hold(now_s, "; ".join(frame.stale))
            self._last_s = now_s
            if events:
                self.sink.record(events)
            return events
        self.held = ""
        decision = self.policy(snapshot)
        actions, refusals = plan(
            snapshot, decision, k, busy=self.busy, held=self.backing_off(now_s)
        )
        for j, reason in refusals:
            logger.debug("refused intent for %s: %s", self.jobs[j].id, reason)
            events.append(Event(now_s, self.jobs[j].id, _REJECTED, "", reason))
        done = execute(
            actions,
            snapshot,
            self.provider,
            self.instance_of,
            cluster=self.options.cluster,
            mover=self.mover,
            launch_env=self.launch_env,
            entrypoint=self.options.entrypoint,
        )
        # Explaining reads only the snapshot: all events at once, then applied in order.
        events += [self._apply(event) for event in self._explained(done, snapshot, frame)]
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
    def _hold(self, now_s: float, reason: str) -> list[Event]:
        """Stale signals: decide nothing. Each unfinished job gets one HELD event with the
        reason when the hold begins or its reason changes."""
        if reason == self.held:
            return []
        self.held = reason
        logger.warning("holding: %s", reason)
        return [
            self._stamp(Event(now_s, job.id, EventKind.HELD, "", reason), j)
            for j, job in enumerate(self.jobs)
            if self.fleet.phase[j] != Phase.DONE and self._start_s[j] <= now_s
        ]

    def _explained(
        self, events: Sequence[Event], snapshot: Snapshot, frame: SignalFrame
    ) -> list[Event]:
        """The launches (and starts of moves) among `events` with the signals they were
        decided on: the destination's price, capacity, carbon and curtailment (and the
        source offer's, for a move), where each came from, and the cheapest offers per hour
        for the job, so `heliotrope explain` can say why. The other events as they are."""
        out = list(events)
        picked = [
            (i, o, self._index[e.job_id])
            for i, e in enumerate(events)
            if (o := self._explained_offer(e)) is not None
        ]
        if not picked:
            return out
        js = np.array([j for _, _, j in picked])
        equiv = self._usd_equivalent_per_hour(snapshot, js)
        usable = np.isfinite(equiv) & (snapshot.fit.rate[js] > 0)
        cheapest = np.argsort(np.where(usable, equiv, np.inf), axis=1)[:, :4].tolist()
        signals = _SignalValues.of(snapshot)
        fleet = snapshot.fleet
        offer_ids = self._offer_ids
        for (i, o, j), equiv_j, usable_j, order in zip(
            picked, equiv.tolist(), usable.tolist(), cheapest, strict=True
        ):
            event = events[i]
            data = dict(event.data)
            data.update(signals.at("dst", o))
            data["dst_usd_equiv_per_hour"] = equiv_j[o]
            src = int(fleet.offer[j])
            if src < 0:
                src = int(fleet.checkpoint_offer[j])
            if src >= 0:
                data.update(signals.at("src", src))
                data["src_usd_equiv_per_hour"] = equiv_j[src]
            data["carbon_usd_per_tonne"] = float(self._carbon_usd_per_tonne[j])
            detail = event.detail
            if frame.basis is not None:
                b = frame.basis
                detail += (
                    f" | price {b.describe(o, 'price')}; capacity "
                    f"{b.describe(o, 'capacity')}; carbon {b.describe(o, 'carbon')}"
                )
            others = [k for k in order if usable_j[k]][:3]
            if others:
                detail += " | cheapest per hour: " + ", ".join(
                    [f"{offer_ids[k]} {equiv_j[k]:.2f}" for k in others]
                )
            out[i] = Event(
                event.time_s,
                event.job_id,
                event.kind,
                event.offer_id,
                detail,
                data,
                event.instance_id,
            )
        return out

    def _explained_offer(self, event: Event) -> int | None:
        """The offer a launch or the start of a planned move goes to, None for any other
        event (or an offer not in the grid): which events `_explained` explains."""
        kind = event.kind
        if (kind is not _LAUNCHED and kind is not _MIGRATION) or not event.offer_id:
            return None
        if kind is _MIGRATION and "planned" not in event.detail.lower():
            return None
        return self._offer_ix.get(event.offer_id)

    def _usd_equivalent_per_hour(self, snapshot: Snapshot, js: IntArray) -> FloatArray:
        """[len(js), offers]: what an hour of job js[i] on each offer costs: dollars plus
        its carbon price of its emissions (USD/h equivalent; the policy weighs progress and
        moves besides)."""
        out: FloatArray = snapshot.usd_per_hour * snapshot.fit.instances[js] + carbon_usd(
            self._kwh[js], snapshot.carbon_g_per_kwh, self._carbon_usd_per_tonne[js, None]
        )
        return out

    def _billed_prices(self, g: SignalGrid, k: int) -> FloatArray:
        """The row's prices, where an offer has none ("not sold" now, a gap in the trace)
        the price of the same machine on demand, else its last known price: time on an
        unpriced offer is never billed at 0."""
        usd: FloatArray = g.usd_per_hour[k]
        missing = np.isnan(usd)
        if not missing.any():
            return usd
        out: FloatArray = usd.copy()
        twin = self._on_demand_twin
        has = missing & (twin >= 0)
        out[has] = usd[twin[has]]
        for o in np.flatnonzero(np.isnan(out)):
            known = g.usd_per_hour[: k + 1, o]
            known = known[~np.isnan(known)]
            if known.size:
                out[o] = known[-1]
        return out

    def _accrue(self, t0_s: float, t1_s: float) -> list[Event]:
        frame = self.frame_at(t0_s)
        k = frame.k
        g = frame.grid
        row = SignalRow(
            self._billed_prices(g, k),
            g.carbon_g_per_kwh[k],
            g.carbon_marginal_g_per_kwh[k],
            g.curtailing[k],
        )
        before = self.fleet.progress_gpu_h.copy() if self.mover is not None else None
        self._accrued = (t0_s, t1_s, row)
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
        observed = list(self.provider.poll_events())
        self.observed = observed  # a live controller acknowledges them after its commit
        if self.options.reconcile:
            listed = self.provider.list_instances(cluster=self.options.cluster)
            young = {j for j, t in self._launched_s.items() if now_s - t < RECONCILE_GRACE_S}
            observed += reconcile(
                self.jobs, self.instance_of, listed, now_s, skip=self.busy | young
            )
        for pe in observed:
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
        if f.checkpointed_gpu_h[j] <= 0.0 and self.mover is None:
            # Preempted before its first checkpoint where the controller's model is the only
            # record of checkpoints (no mover keeps them in a store): there is none to copy,
            # and the job starts over wherever it goes next (no egress, no migration). Where
            # a mover keeps them, the store says, and the mover starts the job over when it
            # holds nothing (`live.driver`'s `_start_over`): a job may have written one the
            # model has not counted yet.
            f.checkpoint_offer[j] = -1
        f.preemptions[j] += 1
        f.preempted_offer[j] = offer
        self._release(j)
        return Event(
            now_s,
            self.jobs[j].id,
            EventKind.PREEMPTED,
            self.offers[offer].id,
            pe.detail,
            {"lost_gpu_h": float(lost)},
            instance_id=pe.instance_id,
        )

    def _on_progress(self, j: int, pe: ProviderEvent, now_s: float) -> None:
        f = self.fleet
        self.failed_starts.pop(j, None)  # it ran: the next failure starts the count again
        f.progress_gpu_h[j] = min(1.0, max(0.0, pe.value)) * self._work[j]
        if pe.checkpointed is not None:  # what a preemption keeps, as the job says
            kept = min(1.0, max(0.0, pe.checkpointed)) * self._work[j]
            f.checkpointed_gpu_h[j] = min(max(f.checkpointed_gpu_h[j], kept), f.progress_gpu_h[j])
        f.checkpointed_gpu_h[j] = max(f.checkpointed_gpu_h[j], 0.0)
        if f.phase[j] == Phase.STARTING:
            f.phase[j] = Phase.RUNNING
        self.progress_seen_s[j] = now_s

    def _on_completed(self, j: int, pe: ProviderEvent, now_s: float) -> Event:
        f = self.fleet
        offer = int(f.offer[j])
        self._unbill_after_exit(j, offer, pe.time_s)
        f.progress_gpu_h[j] = f.checkpointed_gpu_h[j] = self._work[j]
        f.finished_at_s[j] = pe.time_s or now_s
        f.phase[j] = Phase.DONE
        self.instance_of[j] = None
        f.offer[j] = -1
        return Event(
            now_s,
            self.jobs[j].id,
            EventKind.FINISHED,
            self.offers[offer].id,
            "the job exited successfully",
            instance_id=pe.instance_id,
        )

    def _unbill_after_exit(self, j: int, offer: int, exited_s: float) -> None:
        """A job that says when it exited (the local provider does) is charged until then,
        as a replay charges a job until it finishes: the interval just accrued is taken
        back from the exit on."""
        if not self.options.progress_from_provider or self._accrued is None or offer < 0:
            return  # a replay models the finish itself, inside the interval
        t0_s, t1_s, row = self._accrued
        if not exited_s or not t0_s < exited_s < t1_s:
            return
        hours = np.array([-units.hours(t1_s - exited_s)])
        charge(self.fleet, self.fit, row, np.array([j]), np.array([offer]), hours)

    def _on_failed(self, j: int, pe: ProviderEvent, now_s: float) -> Event:
        offer = int(self.fleet.offer[j])
        self._release(j)
        n = self.failed_starts.get(j, (0, 0.0))[0] + 1
        self.failed_starts[j] = (n, now_s)
        retry = datetime.fromtimestamp(now_s + failure_backoff_s(n), UTC)
        return Event(
            now_s,
            self.jobs[j].id,
            EventKind.TERMINATED,
            self.offers[offer].id,
            f"failed: {pe.detail[-300:]}; not relaunched before {retry:%Y-%m-%d %H:%M:%S} "
            f"UTC ({n} failure(s) in a row)",
            instance_id=pe.instance_id,
        )

    def backing_off(self, now_s: float) -> dict[int, str]:
        """Jobs whose last runs failed, and why they are not relaunched yet."""
        out = {}
        for j, (n, last_s) in self.failed_starts.items():
            until = last_s + failure_backoff_s(n)
            if now_s < until:
                when = datetime.fromtimestamp(until, UTC)
                out[j] = (
                    f"backing off after {n} failure(s) in a row: not relaunched before "
                    f"{when:%Y-%m-%d %H:%M:%S} UTC"
                )
        return out

    def _snapshot(self, now: datetime, now_s: float, frame: SignalFrame) -> Snapshot:
        g, k = frame.grid, frame.k
        held = self.fleet.offer >= 0
        used = np.bincount(
            self.fleet.offer[held],
            weights=self.fit.instances[held, self.fleet.offer[held]],
            minlength=len(g.offers),
        )
        capacity = np.where(self._spot, g.spot_capacity[k] - used, np.inf)
        capacity.setflags(write=False)
        return Snapshot(
            now=now,
            now_s=now_s,
            tick_h=units.hours(float(g.tick_s)),
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
        if event.kind is _TERMINATED:
            if f.phase[j] != _DONE:
                # A move or pause checkpoints first (executor contract): nothing is lost.
                f.checkpointed_gpu_h[j] = f.progress_gpu_h[j]
            self._release(j)
        elif event.kind is _LAUNCHED:
            o = self._offer_ix[event.offer_id]
            src = int(f.checkpoint_offer[j])
            if src >= 0 and self.offers[src].zone != self.offers[o].zone:
                f.migrations[j] += 1
            egress = float(event.data.get("egress_usd", 0.0))
            f.egress_usd[j] += egress
            f.usd[j] += egress
            f.offer[j] = o
            f.checkpoint_offer[j] = o
            f.ready_at_s[j] = float(event.data["ready_at_s"])
            f.last_checkpoint_s[j] = np.nan
            f.phase[j] = _STARTING
            f.launches[j] += 1
            self.instance_of[j] = event.instance_id or None
            self._launched_s[j] = event.time_s
        return self._stamp(event, j)

    def _release(self, j: int) -> None:
        f = self.fleet
        f.offer[j] = -1
        f.ready_at_s[j] = np.nan
        f.last_checkpoint_s[j] = np.nan
        if f.phase[j] != _DONE:
            f.phase[j] = _WAITING
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
        e = event
        return Event(e.time_s, e.job_id, e.kind, e.offer_id, e.detail, data, e.instance_id)


@dataclasses.dataclass(frozen=True, slots=True)
class _SignalValues:
    """The signals of a snapshot's offers as Python numbers, for event data."""

    usd_per_hour: list[float]
    spot_capacity: list[float]
    g_co2_per_kwh: list[float]
    curtailing: list[bool]

    @staticmethod
    def of(snapshot: Snapshot) -> _SignalValues:
        return _SignalValues(
            snapshot.usd_per_hour.tolist(),
            snapshot.spot_capacity.tolist(),
            snapshot.carbon_g_per_kwh.tolist(),
            snapshot.curtailing.astype(bool).tolist(),
        )

    def at(self, prefix: str, o: int) -> dict[str, float]:
        """Offer `o`'s signals as event data (``dst_usd_per_hour``, ...)."""
        usd, capacity, carbon, curtailing = _SIGNAL_KEYS[prefix]
        return {
            usd: self.usd_per_hour[o],
            capacity: self.spot_capacity[o],
            carbon: self.g_co2_per_kwh[o],
            curtailing: float(self.curtailing[o]),
        }


_SIGNAL_KEYS = {
    prefix: tuple(
        f"{prefix}_{name}"
        for name in ("usd_per_hour", "spot_capacity", "g_co2_per_kwh", "curtailing")
    )
    for prefix in ("src", "dst")
}
