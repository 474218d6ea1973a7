"""The live controller: `loop.Controller` over a state store, a provider and real time.

Per tick:
1. if another writer committed since our last commit, reload jobs, rows, open migrations
   and the time the fleet is accrued until from the store (new submissions, a manual
   `heliotrope migrate`, another controller's tick): a one-shot tick (Airflow), a restarted
   and a continuous controller accrue the same for the same period;
2. advance open migrations (`MigrationDriver.step`), each through as many phases as the
   world allows now;
3. optionally reclaim spot instances the scenario says are gone (the local provider's
   stand-in for a cloud's spot reclaim);
4. `Controller.tick(now)`: accrue, observe and reconcile, read the signal view, decide,
   plan, act; the moves it planned are advanced at once, as far as the world allows (a
   local move launches its destination in the tick that decided it, as a replay does);
5. write what the controller observed itself as signal samples (a refused spot launch or
   a preemption: no capacity at that offer for `capacity_backoff_s`), which the live view
   reads back like any polled signal;
6. commit the tick's events, the per-job rows that changed (against the rows as loaded or
   last committed) and migration records with the
   version read in 1. A `VersionConflict` means another controller acted: nothing of ours
   is written, and the next tick starts from the store again.

Operator controls (`heliotrope jobs cancel / hold`, `migrate --hold`; stored with the job):
the policy's intents for a cancelled job are replaced by "stop it" while it holds an
instance and dropped after; a held job's intents are dropped while it holds an instance
and the hold lasts (a held job that lost its instance may be placed again, so a hold never
strands a job). A manual policy (`manual = True`: `migrate`, `cancel`) is not filtered.

With a `FleetLock` (`lock=`), a tick first takes or re-checks the fleet lock; when another
controller holds it, this one is a standby: it acts on nothing, forgets its cached fleet
and keeps only the time, so that on taking over it reloads from the store and accrues from
its last (standby) tick, not over the interval the leader already accounted.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from orchestrator import failpoints
from orchestrator.clock import Clock
from orchestrator.errors import TransientError
from orchestrator.live.driver import MigrationDriver, StoreUri
from orchestrator.live.fleet_lock import FleetLock
from orchestrator.loop import Controller, EventLog, LoopOptions
from orchestrator.migration import Limits
from orchestrator.model import (
    Decision,
    Event,
    EventKind,
    InstanceId,
    Intent,
    JobSpec,
    Market,
    Offer,
    Phase,
    SignalKind,
)
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.sources.keys import spot_key
from orchestrator.signals.view import OBSERVED_SOURCE, SignalView, as_view
from orchestrator.state import (
    JobRow,
    LoadedFleet,
    SignalSample,
    StateStore,
    fleet_from_rows,
    rows_from_fleet,
)
from policies.base import Policy, Snapshot
from providers.base import ComputeProvider, acknowledging, preemptible

logger = logging.getLogger(__name__)

CANCELLED = "cancelled"


@dataclass
class OperatorControls:
    """The configured policy, under what the operator decided: `cancelled` jobs (indices)
    are stopped and never placed again; `held` jobs (index: until when, seconds) keep their
    instance until the hold ends."""

    policy: Policy
    cancelled: frozenset[int]
    held: Mapping[int, float]
    name: str = ""  # the configured policy's

    def __call__(self, snapshot: Snapshot) -> Decision:
        intents = dict(self.policy(snapshot).intents)
        offer = snapshot.fleet.offer
        for j in self.cancelled:
            if offer[j] >= 0:
                intents[j] = Intent(None, "cancelled by the operator")
            else:
                intents.pop(j, None)
        for j, until_s in self.held.items():
            if j in intents and offer[j] >= 0 and snapshot.now_s < until_s:
                logger.debug("job %d is held until %s: intent %s ignored", j, until_s, intents[j])
                del intents[j]
        return Decision(intents)


class LiveController:
    def __init__(
        self,
        *,
        store: StateStore,
        provider: ComputeProvider,
        policy: Policy,
        grid: SignalView | SignalGrid,
        clock: Clock,
        store_uri: StoreUri,
        options: LoopOptions,
        reclaim_spot: bool = False,
        limits: Limits | None = None,
        lock: FleetLock | None = None,
        capacity_backoff_s: float = 0.0,
    ) -> None:
        self.store = store
        self.provider = provider
        self.policy = policy
        self.view = as_view(grid)
        self.offers = self.view.offers
        self.clock = clock
        self.capacity_backoff_s = capacity_backoff_s
        self.store_uri = store_uri
        self.options = options
        self.reclaim_spot = reclaim_spot
        self.lock = lock
        self.driver = MigrationDriver(
            provider=provider,
            store_uri=store_uri,
            cluster=options.cluster,
            launch_env=self.launch_env,
            limits=limits,
            store=store,
        )
        self.controller: Controller | None = None
        self._stored: dict[str, JobRow] = {}  # the rows as the store holds them
        self.version = -1
        self.ticks = 0
        self.commits = 0  # ticks whose commit the store accepted
        self.conflicts = 0  # ticks refused with VersionConflict (another writer acted)
        self.standby_ticks = 0  # of `ticks`: skipped, another controller held the lock
        self.cancelled: frozenset[int] = frozenset()  # of the loaded jobs
        self._last_tick_s = 0.0  # clock time the last tick started at
        # Advance the moves a tick plans within it. A command's one-shot tick (`migrate`)
        # only commits its plan, and the running controller, the one actor, moves the job.
        self.start_moves = True

    def launch_env(self, job: JobSpec, offer: Offer) -> Mapping[str, str]:
        return {
            "HELIOTROPE_CHECKPOINT_URI": self.store_uri(offer),
            "HELIOTROPE_REGION": offer.region,
        }

    def reload(self) -> None:
        """Rebuild the controller (and its policy's view) from the store at the next tick;
        it accrues from the time the store says the fleet is accrued until."""
        self.controller = None

    # -- the loop ---------------------------------------------------------------------------
    def tick(self) -> list[Event]:
        now = self.clock.now()
        self._last_tick_s = now.timestamp()
        if self.lock is not None and not self.lock.try_acquire():
            self.controller = None  # the leader changes the fleet: reload on taking over
            self.standby_ticks += 1
            self.ticks += 1
            return []
        controller = self._sync()
        now_s = now.timestamp()
        shown: list[Event] = []

        def commit(events: list[Event], accrued_until_s: float | None) -> bool:
            shown.extend(events)
            return self._commit(controller, events, accrued_until_s)

        events = self.driver.step(now_s, lambda evs: commit(evs, None))
        if self.controller is None:  # a commit was refused: start from the store next tick
            self.ticks += 1
            return shown
        if self.reclaim_spot:
            self._reclaim(now)
        events += controller.tick(now)
        self._observed(events)
        if commit(events, now_s) and self.start_moves and self.driver.begun:
            events = self.driver.step_begun(now_s, lambda evs: commit(evs, now_s))
            if events or self.driver.changed:
                commit(events, now_s)
        self.ticks += 1
        return shown

    def run(
        self,
        *,
        once: bool = False,
        interval_s: float = 60.0,
        until_done: bool = False,
        max_ticks: int | None = None,
        on_tick: Callable[[LiveController, list[Event]], None] | None = None,
    ) -> None:
        """Tick now, then on every multiple of `interval_s` (clock seconds since the epoch:
        every 10 minutes means at :00, :10, ...), the times a replay of the same period
        decides at. A tick that runs past the next mark skips it (logged) rather than
        drifting the schedule. `until_done` stops when every job is done; `once` after one
        tick."""
        while True:
            events = self.tick()
            if on_tick is not None:
                on_tick(self, events)
            if once or (max_ticks is not None and self.ticks >= max_ticks):
                return
            if until_done and self.finished and not self.driver.open:
                return
            self.clock.sleep(self._until_next_mark(interval_s))

    def _until_next_mark(self, interval_s: float) -> float:
        now_s = self.clock.now().timestamp()
        mark = math.floor(now_s / interval_s + 1e-3)  # a sleep that woke a hair early
        next_s = (mark + 1) * interval_s
        missed = mark - math.floor(self._last_tick_s / interval_s + 1e-3)
        if missed >= 1:
            logger.warning(
                "tick took %.0f s of the %.0f s interval: %d tick(s) skipped",
                now_s - self._last_tick_s,
                interval_s,
                missed,
            )
        return max(0.0, next_s - now_s)

    # -- state --------------------------------------------------------------------------------
    def _sync(self) -> Controller:
        version = self.store.version()
        if self.controller is not None and version == self.version:
            return self.controller
        loaded, version = self.store.load()
        fleet, instance_of = fleet_from_rows(loaded.jobs, loaded.rows, self.offers)
        controller = Controller(
            loaded.jobs,
            self.view,
            self.provider,
            self._controlled(loaded),
            EventLog(),
            self.options,
            mover=self.driver,
            launch_env=self.launch_env,
        )
        controller.restore(fleet, instance_of, loaded.accrued_until_s)
        self._recall_failures(controller)
        if self.controller is not None:  # keep what the old one learned this run
            old = {job.id: j for j, job in enumerate(self.controller.jobs)}
            for j, job in enumerate(loaded.jobs):
                if job.id in old and old[job.id] in self.controller.progress_seen_s:
                    controller.progress_seen_s[j] = self.controller.progress_seen_s[old[job.id]]
        self.driver.attach(controller, loaded.migrations)
        self.controller, self.version = controller, version
        self._stored = dict(loaded.rows)
        return controller

    def _controlled(self, loaded: LoadedFleet) -> Policy:
        """The policy, under the operator's cancels and holds (module docstring)."""
        index = {job.id: j for j, job in enumerate(loaded.jobs)}
        self.cancelled = frozenset(
            index[i] for i, s in loaded.status.items() if s == CANCELLED and i in index
        )
        held = {index[i]: t for i, t in loaded.held_until_s.items() if i in index}
        if getattr(self.policy, "manual", False) or not (self.cancelled or held):
            return self.policy
        return OperatorControls(self.policy, self.cancelled, held, name=self.policy.name)

    @property
    def finished(self) -> bool:
        """Every job done, or cancelled and stopped."""
        c = self.controller
        if c is None:
            return False
        phase, offer = c.fleet.phase, c.fleet.offer
        return all(
            phase[j] == Phase.DONE or (j in self.cancelled and offer[j] < 0)
            for j in range(len(c.jobs))
        )

    def _observed(self, events: Sequence[Event]) -> None:
        """What this tick learned about spot capacity, as samples: a spot launch refused for
        capacity, or a preemption, means none at that offer for `capacity_backoff_s`."""
        if self.capacity_backoff_s <= 0:
            return
        by_id = {o.id: o for o in self.offers}
        samples = []
        for e in events:
            offer = by_id.get(e.offer_id)
            if offer is None or offer.market is not Market.SPOT:
                continue
            refused = e.kind is EventKind.REJECTED and e.detail.startswith("capacity")
            if not (refused or e.kind is EventKind.PREEMPTED):
                continue
            when = datetime.fromtimestamp(e.time_s, UTC)
            samples.append(
                SignalSample(
                    time=when,
                    key=spot_key(offer.cloud, offer.region, offer.zone, offer.instance_type),
                    kind=SignalKind.SPOT_AVAILABILITY,
                    value=0.0,
                    unit="instances",
                    source=OBSERVED_SOURCE,
                    observed_at=when,
                    valid_until=when + timedelta(seconds=self.capacity_backoff_s),
                )
            )
        if samples:
            try:
                self.store.append_samples(samples)
            except TransientError as exc:  # the next refusal will say it again
                logger.warning("could not record observed capacity: %s", exc)

    def _recall_failures(self, controller: Controller) -> None:
        """Failed runs in a row of jobs waiting to be relaunched, from their history, so a
        new controller (a one-shot tick, a restart) keeps backing off as the old one did."""
        if self.controller is not None:  # keep what this process counted
            old = {job.id: j for j, job in enumerate(self.controller.jobs)}
            for j, job in enumerate(controller.jobs):
                if job.id in old and old[job.id] in self.controller.failed_starts:
                    controller.failed_starts[j] = self.controller.failed_starts[old[job.id]]
            return
        waiting = np.flatnonzero(
            (controller.fleet.phase == Phase.WAITING) & (controller.fleet.launches > 0)
        )
        for j in map(int, waiting):
            n, last = 0, 0.0
            for e in reversed(self.store.history(controller.jobs[j].id)):
                if e.kind is EventKind.TERMINATED and e.detail.startswith("failed:"):
                    n, last = n + 1, max(last, e.time_s)
                elif e.kind in (EventKind.LAUNCHED, EventKind.REJECTED, EventKind.HELD):
                    continue
                else:
                    break
            if n:
                controller.failed_starts[j] = (n, last)

    def _commit(
        self, controller: Controller, events: Sequence[Event], accrued_until_s: float | None
    ) -> bool:
        """Store the events, the changed rows and migration records; False when refused."""
        rows = rows_from_fleet(
            controller.jobs, controller.fleet, self.offers, controller.instance_of
        )
        changed = {k: r for k, r in rows.items() if r != self._stored.get(k)}
        migrations = self.driver.drain_records()
        try:
            self.version = self.store.commit(
                events,
                changed,
                expected_version=self.version,
                migrations=migrations,
                accrued_until_s=accrued_until_s,
            )
            self.commits += 1
            self._stored.update(changed)
        except TransientError as exc:  # VersionConflict: another writer acted first
            logger.warning("commit refused (%s); reloading from the store next tick", exc)
            self.controller = None
            self.conflicts += 1
            return False  # not acknowledged: the provider reports its events again
        ack = acknowledging(self.provider)
        if ack is not None:  # committed: the provider may stop repeating them
            ack.acknowledge(controller.observed)
        for record in migrations:  # tests kill the process here (orchestrator/failpoints.py)
            failpoints.hit("migration.after", record.phase)
        return True

    def _reclaim(self, now: datetime) -> None:
        """Stop spot instances whose offer has no capacity now (the local provider's
        stand-in for a cloud reclaiming spot), by the signals the policy reads."""
        controller = self.controller
        reclaimer = preemptible(self.provider)
        if controller is None or reclaimer is None:
            return
        frame = controller.frame_at(now.timestamp())
        if frame.stale:
            return
        capacity = frame.grid.spot_capacity[frame.k]
        fleet = controller.fleet
        held: dict[int, list[int]] = {}
        for j, instance in enumerate(controller.instance_of):
            o = int(fleet.offer[j])
            free = instance is None or o < 0 or j in controller.busy
            if not free and self.offers[o].market is Market.SPOT:
                held.setdefault(o, []).append(j)
        # As the simulated cloud of a replay reclaims (providers/sim.py): while an offer
        # holds more instances than its capacity, the newest launch goes first.
        victims: list[InstanceId] = []
        for o, js in held.items():
            total = sum(int(controller.fit.instances[j, o]) for j in js)
            for j in sorted(js, key=lambda j: -float(fleet.ready_at_s[j])):
                if total <= capacity[o]:
                    break
                instance = controller.instance_of[j]
                assert instance is not None
                logger.info(
                    "spot capacity %g at %s: preempting %s",
                    capacity[o],
                    self.offers[o].id,
                    instance,
                )
                victims.append(instance)
                total -= int(controller.fit.instances[j, o])
        # All notices at once, as a cloud reclaims a zone: each preempt waits for its job
        # to checkpoint and leave, and one after the other they would overrun the tick.
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(victims)))) as pool:
            list(pool.map(lambda i: reclaimer.preempt(i, notice_s=1.0), victims))

    def fleet_table(self) -> list[dict[str, object]]:
        c = self.controller
        if c is None:
            return []
        rows = []
        for j, job in enumerate(c.jobs):
            o = int(c.fleet.offer[j])
            rows.append(
                {
                    "job": job.id,
                    "phase": Phase(int(c.fleet.phase[j])).name.lower(),
                    "where": self.offers[o].id if o >= 0 else "",
                    "progress": float(c.fleet.progress_gpu_h[j] / job.work_gpu_hours),
                    "usd": float(c.fleet.usd[j]),
                    "kg_co2": float(c.fleet.kg_co2[j]),
                    "migrating": j in c.busy,
                }
            )
        return rows
