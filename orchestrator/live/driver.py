"""Drive live migrations: the `Mover` the executor hands cross-region moves to.

Each tick, for every open migration, the driver observes the world (the provider's live
instances, the newest verified checkpoint in the source and destination stores, the job's
reported progress), calls the pure `advance`, and performs the actions it returns:

- `RequestCheckpoint` / `Terminate`: stop the instance through the provider (locally a
  SIGTERM: the job checkpoints, then exits within the grace period);
- `CopyCheckpoint`: stream the checkpoint into the destination region's store and verify it
  (`CheckpointStore.copy`, idempotent by request id);
- `Launch`: start the job at the target offer with its checkpoint location in the env.

Every action is idempotent by its request id, and the record is committed with the tick's
events. A controller killed between acting and committing redoes the step from the last
committed record: `advance` returns the same actions with the same ids, which deduplicate.

A launch that made an instance is written to the store's instances table (with its request
id) before the tick commits, so a controller that takes over (a new process on the same
store) finds the instances of the open migrations' launches by their request ids instead of
reporting them unseen, or leaking a destination it never knew to stop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from orchestrator import units
from orchestrator.checkpoints import CheckpointStore
from orchestrator.costs import move_cost
from orchestrator.errors import HeliotropeError, TransientError
from orchestrator.loop import Controller
from orchestrator.migration import (
    NOTHING_TO_MOVE,
    CheckpointSeen,
    CopyCheckpoint,
    Launch,
    Limits,
    Migration,
    MigrationPhase,
    Observation,
    RequestCheckpoint,
    Terminate,
    advance,
)
from orchestrator.model import Event, EventKind, InstanceId, JobSpec, Offer, Phase
from orchestrator.state import InstanceRecord, MigrationRecord, StateStore
from policies.base import Snapshot
from providers.base import ComputeProvider, InstanceState, Launcher, LaunchOutcome, LaunchSpec

logger = logging.getLogger(__name__)

StoreUri = Callable[[Offer], str]
LaunchEnvFn = Callable[[JobSpec, Offer], Mapping[str, str]]
Commit = Callable[[list[Event]], bool]  # store these events and the changed records


class MigrationDriver:
    """Open migrations of one controller, advanced one step per tick."""

    def __init__(
        self,
        *,
        provider: ComputeProvider,
        store_uri: StoreUri,
        cluster: str,
        launch_env: LaunchEnvFn,
        limits: Limits | None = None,
        store: StateStore | None = None,
    ) -> None:
        self.provider = provider
        self.store = store  # where launches are recorded, and found again after a takeover
        self.store_uri = store_uri
        self.cluster = cluster
        self.launch_env = launch_env
        self.limits = limits or Limits()
        self.controller: Controller | None = None
        self.open: dict[str, Migration] = {}
        self.changed: dict[str, Migration] = {}  # to commit with this tick
        self._launches: dict[str, tuple[str, LaunchOutcome, float]] = {}  # mig id/offer -> ...
        self._unrecorded: dict[str, InstanceRecord] = {}  # by request id: store was busy
        self._copy_errors: dict[str, str] = {}
        self._alive: Mapping[InstanceId, object] = {}
        self._offers: dict[str, Offer] = {}  # of the attached controller's grid, by id
        self._jobs: dict[str, int] = {}  # job id -> index in the attached controller
        self._begun: set[str] = set()  # ids of the migrations planned since the last step
        self.max_phases = len(MigrationPhase)  # phase changes of one migration in one step

    def attach(self, controller: Controller, records: Sequence[MigrationRecord]) -> None:
        """Bind to a (re)built controller and resume the open migrations from the store."""
        self.controller = controller
        self._offers = {o.id: o for o in controller.grid.offers}
        self._jobs = {job.id: j for j, job in enumerate(controller.jobs)}
        self.open = {}
        for record in records:
            m = from_record(record)
            self.open[m.job_id] = m
        controller.busy = {self._jobs[j] for j in self.open if j in self._jobs}
        self._recover_launches()

    def _recover_launches(self) -> None:
        """Fill in, from the store, the launches of open migrations this process has not
        seen (another controller made them): the destination's newest launch and the
        rollback's current one, matched by request id."""
        if self.store is None:
            return
        for m in self.open.values():
            if m.phase not in _LAUNCHED_PHASES:
                continue
            wanted: dict[str, tuple[str, int]] = {}  # request id -> (key, attempt)
            dst_key, src_key = f"{m.id}/{m.dst_offer_id}", f"{m.id}/{m.src_offer_id}"
            if dst_key not in self._launches:
                for attempt in range(max(self.limits.max_attempts, m.attempt + 1)):
                    rid = dataclasses.replace(m, attempt=attempt).request_id("launch")
                    wanted[rid] = (dst_key, attempt)
            if m.phase is MigrationPhase.ROLLING_BACK and src_key not in self._launches:
                wanted[m.request_id("rollback")] = (src_key, 0)
            if not wanted:
                continue
            found = sorted(
                (
                    i
                    for i in self.store.instances(self.cluster, job_id=m.job_id)
                    if i.request_id in wanted
                ),
                key=lambda i: wanted[i.request_id][1],
            )
            for inst in found:  # newest attempt last: it wins
                self._launches[wanted[inst.request_id][0]] = (
                    inst.request_id,
                    LaunchOutcome(inst.id),
                    inst.launched_at.timestamp(),
                )

    # -- Mover -----------------------------------------------------------------------------
    def needs_move(self, snapshot: Snapshot, job: int, dst: int) -> bool:
        f = snapshot.fleet
        src = int(f.offer[job]) if f.offer[job] >= 0 else int(f.checkpoint_offer[job])
        if src < 0 or src == dst:
            return False
        a, b = snapshot.offers[src], snapshot.offers[dst]
        return (a.cloud, a.region) != (b.cloud, b.region)

    def begin(self, snapshot: Snapshot, job: int, dst: int, reason: str) -> list[Event]:
        assert self.controller is not None
        f = snapshot.fleet
        spec = snapshot.jobs[job]
        src = int(f.offer[job]) if f.offer[job] >= 0 else int(f.checkpoint_offer[job])
        m = Migration.planned(
            id=f"{spec.id}@{int(snapshot.now_s)}",
            job_id=spec.id,
            src_offer_id=snapshot.offers[src].id,
            dst_offer_id=snapshot.offers[dst].id,
            src_instance_id=self.controller.instance_of[job] or "",
            now_s=snapshot.now_s,
        )
        self.open[spec.id] = m
        self.changed[m.id] = m
        self._begun.add(m.id)
        self.controller.busy.add(job)
        logger.info(
            "migration %s planned: %s -> %s (%s)", m.id, m.src_offer_id, m.dst_offer_id, reason
        )
        return [
            Event(
                snapshot.now_s, spec.id, EventKind.MIGRATION, m.dst_offer_id, f"planned: {reason}"
            )
        ]

    # -- per tick ---------------------------------------------------------------------------
    def step(self, now_s: float, commit: Commit | None = None) -> list[Event]:
        """Advance every open migration as far as the world lets it this tick; returns the
        events applied to the fleet (and not yet given to `commit`)."""
        return self._step(now_s, list(self.open), commit)

    @property
    def begun(self) -> bool:
        """Whether migrations were planned since the last step."""
        return bool(self._begun)

    def step_begun(self, now_s: float, commit: Commit | None = None) -> list[Event]:
        """Advance the migrations planned since the last step (the policy planned them in
        this tick, and their records are committed), so a move starts in the tick that
        decided it, as in a replay."""
        fresh = [k for k, m in self.open.items() if m.id in self._begun]
        return self._step(now_s, fresh, commit)

    def _step(self, now_s: float, job_ids: Sequence[str], commit: Commit | None) -> list[Event]:
        """After acting, the world is observed again and the migration advanced while its
        phase keeps changing: a local stop and a copy finish before they return, so a move
        runs checkpoint, copy and launch in one tick; on a cloud the source is still
        shutting down and the rest waits for the next tick. Before the next pass, `commit`
        stores what this one did (the records in their new phases, the events), so that
        every action is taken from a committed record, as with one phase a tick: a
        controller killed in between redoes the pass with the same request ids. A tick
        commits at most `max_phases` times however many jobs move; a refused commit
        (another writer acted) ends the chain."""
        assert self.controller is not None
        self._begun = set()
        if not job_ids:
            return []
        self._record_instances()
        self._alive = self.provider.list_instances(cluster=self.cluster)
        events: list[Event] = []
        for left in range(self.max_phases, 0, -1):  # a pass changes phases, or it stops
            moving = []
            for job_id in job_ids:
                m = self.open[job_id]
                nxt, actions = advance(m, self._observe(m), now_s, self.limits)
                events += self._apply(m, nxt, actions, now_s)
                if not nxt.terminal and nxt.phase is not m.phase:
                    moving.append(job_id)
            if not moving or commit is None or left == 1:
                break
            if not commit(events):
                return []
            events, job_ids = [], moving
            self._alive = self.provider.list_instances(cluster=self.cluster)
        return events

    def _apply(
        self, m: Migration, nxt: Migration, actions: Sequence[object], now_s: float
    ) -> list[Event]:
        assert self.controller is not None
        job_id = m.job_id
        events: list[Event] = []
        if nxt.phase is not m.phase:
            why = f": {nxt.error}" if nxt.error and nxt.error != m.error else ""
            events.append(
                Event(
                    now_s,
                    job_id,
                    EventKind.MIGRATION,
                    nxt.dst_offer_id,
                    f"{m.phase.value} -> {nxt.phase.value}{why}",
                )
            )
        self.open[job_id] = nxt
        if nxt != m:
            self.changed[nxt.id] = nxt
        if nxt.error == NOTHING_TO_MOVE and m.error != NOTHING_TO_MOVE:
            self._start_over(self._job_index(job_id))
        for action in actions:
            events += self._perform(nxt, action, now_s)
        if nxt.terminal:
            del self.open[job_id]
            self.controller.busy.discard(self._job_index(job_id))
        return events

    def _start_over(self, j: int) -> None:
        """No instance and no verified checkpoint (preempted before its first one): there is
        nothing to move, so the job starts again from the beginning wherever the policy
        sends it next, instead of planning the same failing move every tick."""
        assert self.controller is not None
        f = self.controller.fleet
        f.checkpoint_offer[j] = -1
        f.progress_gpu_h[j] = 0.0
        f.checkpointed_gpu_h[j] = 0.0

    def drain_records(self) -> list[MigrationRecord]:
        records = [to_record(m) for m in self.changed.values()]
        self.changed = {}
        return records

    # -- observe ----------------------------------------------------------------------------
    def _observe(self, m: Migration) -> Observation:
        assert self.controller is not None
        offers = self._offers
        dst = self._launches.get(f"{m.id}/{m.dst_offer_id}")
        back = self._launches.get(f"{m.id}/{m.src_offer_id}")
        j = self._job_index(m.job_id)
        seen = self.controller.progress_seen_s.get(j, float("-inf"))
        # After a restart the launch is known only from the record (set on RESTORING):
        # its instance id, and progress counts from when the phase began.
        dst_id = (dst[1].instance_id or "") if dst else m.dst_instance_id
        launched_s = dst[2] if dst else m.updated_s
        return Observation(
            src_instance_alive=bool(m.src_instance_id) and m.src_instance_id in self._alive,
            src_checkpoint=self._latest(offers[m.src_offer_id], m.job_id),
            dst_checkpoint=self._latest(offers[m.dst_offer_id], m.job_id),
            dst_instance_id=dst_id,
            dst_state=self._instance_state(dst_id) if dst_id else None,
            dst_progress_after_restore=bool(dst_id) and seen > launched_s,
            launch_error=dst[1].error.kind if dst and dst[1].error else None,
            copy_error=self._copy_errors.get(m.request_id("copy")),
            rollback_instance_id=back[1].instance_id or "" if back else "",
            rollback_state=self._state(back[1]) if back else None,
            job_finished=bool(self.controller.fleet.phase[j] == Phase.DONE),
        )

    def _state(self, outcome: LaunchOutcome) -> InstanceState | None:
        if outcome.instance_id is None:
            return None
        return self._instance_state(outcome.instance_id)

    def _instance_state(self, instance_id: InstanceId) -> InstanceState:
        info = self._alive.get(instance_id)
        return getattr(info, "state", None) or InstanceState.TERMINATED

    def _latest(self, offer: Offer, job_id: str) -> CheckpointSeen | None:
        try:
            ref = CheckpointStore(self.store_uri(offer)).latest(job_id)
        except HeliotropeError as exc:
            logger.warning("checkpoint store for %s unreadable: %s", offer.region, exc)
            return None
        if ref is None:
            return None
        return CheckpointSeen(
            uri=ref.uri, step=ref.step, created_at_s=ref.created_at_s, verified=True
        )

    # -- act --------------------------------------------------------------------------------
    def _perform(self, m: Migration, action: object, now_s: float) -> list[Event]:
        assert self.controller is not None
        c = self.controller
        j = self._job_index(m.job_id)
        offers = self._offers
        if isinstance(action, RequestCheckpoint | Terminate):
            self.provider.terminate([action.instance_id], request_id=action.request_id)
            if c.instance_of[j] == action.instance_id:
                offer = c.grid.offers[int(c.fleet.offer[j])].id
                return [
                    c.apply(
                        Event(
                            now_s,
                            m.job_id,
                            EventKind.TERMINATED,
                            offer,
                            "move: checkpoint and stop",
                            instance_id=action.instance_id,
                        )
                    )
                ]
            return []
        if isinstance(action, CopyCheckpoint):
            self._copy(m, action, offers)
            return []
        if isinstance(action, Launch):
            return self._launch(m, action, offers[action.offer_id], now_s)
        raise TypeError(f"unknown migration action {action!r}")

    def _copy(self, m: Migration, action: CopyCheckpoint, offers: Mapping[str, Offer]) -> None:
        src = CheckpointStore(self.store_uri(offers[m.src_offer_id]))
        dst = CheckpointStore(self.store_uri(offers[action.dst_offer_id]))
        try:
            ref = next((r for r in src.list(m.job_id) if r.uri == action.src_uri), None)
            if ref is None:
                raise HeliotropeError(f"checkpoint {action.src_uri} is not in its store")
            src.copy(ref, dst, request_id=action.request_id)
        except HeliotropeError as exc:
            self._copy_errors[action.request_id] = str(exc)
            logger.warning("copy for %s failed: %s", m.id, exc)

    def _launch(self, m: Migration, action: Launch, offer: Offer, now_s: float) -> list[Event]:
        assert self.controller is not None
        c = self.controller
        j = self._job_index(m.job_id)
        job = c.jobs[j]
        key = f"{m.id}/{offer.id}"
        outcome = self.provider.launch(
            LaunchSpec(
                job_id=job.id,
                offer_id=offer.id,
                cluster=self.cluster,
                startup_s=units.seconds(job.cold_start_h),
                count=int(c.fit.instances[j, c.grid.offers.index(offer)]),
                entrypoint=job.command or c.options.entrypoint,
                env={"HELIOTROPE_JOB_ID": job.id, **self.launch_env(job, offer)},
                launcher=Launcher(job.launcher),
            ),
            request_id=action.request_id,
        )
        prev = self._launches.get(key)
        if prev is None or prev[1] != outcome:
            same = (
                outcome.instance_id is not None
                and prev is not None
                and (prev[0], prev[1].instance_id) == (action.request_id, outcome.instance_id)
            )
            if outcome.instance_id is not None and not same:
                self._record_instances(
                    InstanceRecord(
                        id=outcome.instance_id,
                        provider=self.provider.name,
                        cluster=self.cluster,
                        job_id=job.id,
                        offer_id=offer.id,
                        state=InstanceState.BOOTING.value,
                        launched_at=datetime.fromtimestamp(now_s, UTC),
                        request_id=action.request_id,
                    )
                )
            # The same instance again (e.g. found in the store after a takeover) keeps the
            # time it was launched at.
            self._launches[key] = (action.request_id, outcome, prev[2] if same and prev else now_s)
        if outcome.instance_id is None or c.instance_of[j] == outcome.instance_id:
            return []  # refused (observed next tick), or the same instance again
        src = self._offers[m.src_offer_id]
        cost = move_cost(job, src.location, offer.location, c.options.settings)
        egress = cost.egress_usd if offer.id == m.dst_offer_id else 0.0
        return [
            c.apply(
                Event(
                    now_s,
                    job.id,
                    EventKind.LAUNCHED,
                    offer.id,
                    f"migration {m.id}: {m.phase.value}",
                    {"ready_at_s": outcome.ready_at_s, "egress_usd": egress, "transfer_h": 0.0},
                    instance_id=outcome.instance_id,
                )
            )
        ]

    def _record_instances(self, new: InstanceRecord | None = None) -> None:
        """Write launched instances to the store (and any a busy store refused before)."""
        if new is not None:
            self._unrecorded[new.request_id] = new
        if self.store is None:
            self._unrecorded.clear()
            return
        for rid, record in list(self._unrecorded.items()):
            try:
                self.store.record_instance(record)
            except TransientError as exc:
                logger.warning(
                    "instance %s not recorded yet (%s); retrying next tick", record.id, exc
                )
                return
            del self._unrecorded[rid]

    def _job_index(self, job_id: str) -> int:
        return self._jobs[job_id]


#: Phases in which a migration may have launched instances (at the destination or back).
_LAUNCHED_PHASES = frozenset(
    {
        MigrationPhase.PROVISIONING,
        MigrationPhase.RESTORING,
        MigrationPhase.RUNNING,
        MigrationPhase.ROLLING_BACK,
    }
)


def to_record(m: Migration) -> MigrationRecord:
    detail = {
        k: (v.value if isinstance(v, MigrationPhase) else v)
        for k, v in dataclasses.asdict(m).items()
    }
    return MigrationRecord(
        id=m.id,
        job_id=m.job_id,
        phase=m.phase.value,
        src_offer_id=m.src_offer_id,
        dst_offer_id=m.dst_offer_id,
        request_id=m.request_id("record"),
        checkpoint_uri=m.dst_checkpoint_uri or m.src_checkpoint_uri or None,
        error=m.error or None,
        started_s=m.started_s,
        updated_s=m.updated_s,
        detail=json.dumps(detail, sort_keys=True),
    )


def from_record(record: MigrationRecord) -> Migration:
    if not record.detail:
        raise HeliotropeError(f"migration {record.id} has no machine record to resume from")
    data = json.loads(record.detail)
    data["phase"] = MigrationPhase(data["phase"])
    return Migration(**data)
