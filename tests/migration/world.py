"""A tiny scripted world that migration actions act on, and a controller that can crash.

`World` holds instances and per-offer checkpoint stores (append-only: nothing here can
delete a checkpoint). It performs actions once per request id, like the real executor,
providers and stores, and reports what it holds as an `Observation`, following the
contract in `orchestrator.migration.machine`: errors only for the requests the saved
record waits on.

`Controller` follows the documented protocol (observe -> advance -> save -> act) and can be
told to crash at given ticks, at a given point: before saving, after saving but before
acting, or after performing only the first action. A crash loses the in-memory record; the
restarted controller resumes from the last saved one in the same instant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from orchestrator.migration import (
    TRANSITIONS,
    CheckpointSeen,
    CopyCheckpoint,
    Launch,
    Limits,
    Migration,
    MigrationAction,
    Observation,
    RequestCheckpoint,
    Terminate,
    advance,
)
from orchestrator.migration.machine import Result
from providers.base import FailureKind, InstanceState

SRC, DST = "aws:us-east-1a:p3.2xlarge:spot", "gcp:europe-west4-a:a2-ultragpu-1g:spot"
LIVE = (InstanceState.BOOTING, InstanceState.RUNNING)
TICK_S = 60.0
T0 = 1_700_000_000.0


class Preempt(StrEnum):
    """When the first destination instance is reclaimed."""

    NEVER = "never"
    BOOTING = "booting"  # before the controller sees it boot
    RESTORING = "restoring"  # after it boots, before it makes progress


class Crash(StrEnum):
    BEFORE_SAVE = "before_save"  # advance ran, nothing saved
    BEFORE_ACT = "before_act"  # the new record is saved, no action performed
    MID_ACT = "mid_act"  # the new record is saved, only its first action performed


@dataclass
class Instance:
    id: str
    offer_id: str
    state: InstanceState
    step: int  # the training step the job is at
    restored_step: int  # the step it restored from (-1: started from scratch or original)
    age: int = 0  # ticks since launch
    launched_by: str = ""  # request id ("" for the job's original instance)


@dataclass
class Script:
    """How the world misbehaves. Failure lists are consumed one per new request."""

    src_alive: bool = True  # the job holds a live instance at the source
    job_step: int = 15  # where that instance is
    stops_on_request: bool = True  # it exits after checkpointing when asked
    answers_request: bool = True  # it checkpoints when asked at all
    launch_failures: dict[str, list[FailureKind]] = field(default_factory=dict)  # per offer
    copy_failures: int = 0
    preempt_dst: Preempt = Preempt.NEVER
    dst_restore_hangs: bool = False  # the destination boots but never makes progress
    boot_ticks: int = 2


class World:
    def __init__(self, script: Script, *, now_s: float = T0) -> None:
        self.script = script
        self.now_s = now_s
        self.instances: dict[str, Instance] = {}
        self.stores: dict[str, list[CheckpointSeen]] = {SRC: [], DST: []}
        self.performed: dict[str, MigrationAction] = {}  # request id -> action, performed once
        self.failed: dict[str, str] = {}  # request id -> failure (FailureKind value or message)
        self.launch_failures = {k: list(v) for k, v in script.launch_failures.items()}
        self.copy_failures = script.copy_failures
        self.preempted_dst = False
        self.terminated_src_after: list[CheckpointSeen | None] = []
        # the job's last periodic checkpoint, before the migration starts
        self.stores[SRC].append(CheckpointSeen(f"{SRC}/ckpt-10", 10, now_s - 600.0, True))
        if script.src_alive:
            self.instances["src-0"] = Instance(
                "src-0", SRC, InstanceState.RUNNING, script.job_step, restored_step=-1
            )

    # --- what the controller sees ---------------------------------------------------------

    def observe(self, m: Migration, waiting_on: Sequence[MigrationAction]) -> Observation:
        src = self.instances.get(m.src_instance_id)
        dst = self._newest_launched(DST)
        back = self._newest_launched(SRC)
        launch_error = copy_error = None
        for a in waiting_on:
            failure = self.failed.get(a.request_id)
            if failure is not None and isinstance(a, Launch):
                launch_error = FailureKind(failure)
            if failure is not None and isinstance(a, CopyCheckpoint):
                copy_error = failure
        return Observation(
            src_instance_alive=src is not None and src.state in LIVE,
            src_checkpoint=self.newest(SRC),
            dst_checkpoint=self.newest(DST),
            dst_instance_id=dst.id if dst else "",
            dst_state=dst.state if dst else None,
            dst_progress_after_restore=bool(
                dst and dst.step > dst.restored_step and dst.state is InstanceState.RUNNING
            ),
            launch_error=launch_error,
            copy_error=copy_error,
            rollback_instance_id=back.id if back else "",
            rollback_state=back.state if back else None,
        )

    def newest(self, offer: str) -> CheckpointSeen | None:
        return self.stores[offer][-1] if self.stores[offer] else None

    def live(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.state in LIVE]

    def _newest_launched(self, offer: str) -> Instance | None:
        mine = [i for i in self.instances.values() if i.offer_id == offer and i.launched_by]
        return mine[-1] if mine else None

    # --- what actions do ------------------------------------------------------------------

    def perform(self, action: MigrationAction) -> None:
        if action.request_id in self.performed:
            assert self.performed[action.request_id] == action, "one request id, two actions"
            return
        self.performed[action.request_id] = action
        if isinstance(action, RequestCheckpoint):
            inst = self.instances[action.instance_id]
            if inst.state in LIVE and self.script.answers_request:
                self._write(inst)
                if self.script.stops_on_request:
                    inst.state = InstanceState.TERMINATED
        elif isinstance(action, CopyCheckpoint):
            if self.copy_failures > 0:
                self.copy_failures -= 1
                self.failed[action.request_id] = "connection reset"
                return
            ck = next(c for c in self.stores[SRC] if c.uri == action.src_uri)
            assert ck.verified
            uri = f"{action.dst_offer_id}/ckpt-{ck.step}"
            if all(c.uri != uri for c in self.stores[action.dst_offer_id]):
                self.stores[action.dst_offer_id].append(
                    CheckpointSeen(uri, ck.step, ck.created_at_s, True)
                )
        elif isinstance(action, Launch):
            failures = self.launch_failures.get(action.offer_id, [])
            if failures:
                self.failed[action.request_id] = failures.pop(0).value
                return
            step = -1
            if action.checkpoint_uri:
                ck = next(c for c in self.stores[action.offer_id] if c.uri == action.checkpoint_uri)
                assert ck.verified, "launched from an unverified checkpoint"
                step = ck.step
            iid = f"i-{len(self.instances)}"
            self.instances[iid] = Instance(
                iid,
                action.offer_id,
                InstanceState.BOOTING,
                max(step, 0),
                step,
                launched_by=action.request_id,
            )
        elif isinstance(action, Terminate):
            inst = self.instances[action.instance_id]
            if not inst.launched_by:
                self.terminated_src_after.append(self.newest(SRC))
            if inst.state in LIVE:
                inst.state = InstanceState.TERMINATED

    def _write(self, inst: Instance) -> None:
        uri = f"{inst.offer_id}/ckpt-{inst.step}"
        if all(c.uri != uri for c in self.stores[inst.offer_id]):
            self.stores[inst.offer_id].append(CheckpointSeen(uri, inst.step, self.now_s, True))

    def tick(self) -> None:
        self.now_s += TICK_S
        for inst in list(self.instances.values()):
            if inst.state not in LIVE:
                continue
            inst.age += 1
            first_dst = inst.offer_id == DST and inst.launched_by and not self.preempted_dst
            preempt_at = {Preempt.BOOTING: 1, Preempt.RESTORING: self.script.boot_ticks}
            if first_dst and inst.age == preempt_at.get(self.script.preempt_dst):
                inst.state = InstanceState.PREEMPTED
                self.preempted_dst = True
                continue
            if inst.state is InstanceState.BOOTING and inst.age >= self.script.boot_ticks:
                inst.state = InstanceState.RUNNING
            elif inst.state is InstanceState.RUNNING and not (
                inst.offer_id == DST and inst.launched_by and self.script.dst_restore_hangs
            ):
                inst.step += 1


@dataclass
class Record:
    """What the controller saves: the migration and the actions it is about to perform."""

    migration: Migration
    actions: list[MigrationAction]


@dataclass
class Run:
    final: Migration
    phases: list[str]  # every saved phase, in order
    # (lost, again): what a crash lost, and what the restarted controller's first advance
    # returned before it re-performed anything (same world, same instant)
    reissued: list[tuple[Result, Result]]
    crashed_in: list[tuple[str, str]]  # (phase of the record, phase it was moving to) per crash
    ticks: int  # full ticks taken (crashes do not count)


class Controller:
    def __init__(self, world: World, migration: Migration, limits: Limits) -> None:
        self.world = world
        self.limits = limits
        self.saved = Record(migration, [])

    def run(
        self,
        *,
        crash_at: frozenset[int] = frozenset(),
        crash: Crash = Crash.BEFORE_ACT,
        max_ticks: int = 200,
    ) -> Run:
        phases = [str(self.saved.migration.phase)]
        reissued: list[tuple[Result, Result]] = []
        lost: Result | None = None
        restarting = False
        crashed: set[int] = set()
        crashed_in: list[tuple[str, str]] = []
        tick = 0
        while tick < max_ticks:
            if restarting:
                restarting = False
                if lost is not None and not self.saved.migration.terminal:
                    reissued.append((lost, self._advance(self.saved)))
                lost = None
                for a in self.saved.actions:  # protocol step 0
                    self.world.perform(a)
            record = self.saved
            m, actions = self._advance(record)
            before = record.migration.phase
            assert m.phase == before or m.phase in TRANSITIONS[before], (before, m.phase)
            crash_now = tick in crash_at and tick not in crashed
            if crash_now:
                crashed.add(tick)
                crashed_in.append((str(before), str(m.phase)))
                restarting = True
            if crash_now and crash is Crash.BEFORE_SAVE:
                lost = (m, actions)
                continue
            self.saved = Record(m, actions)
            if m.phase != phases[-1]:
                phases.append(str(m.phase))
            if crash_now and crash is Crash.BEFORE_ACT:
                lost = (m, actions)
                continue
            for a in actions[:1] if crash_now else actions:  # MID_ACT: the first one only
                self.world.perform(a)
            if crash_now:
                continue
            if m.terminal:
                return Run(m, phases, reissued, crashed_in, tick)
            self.world.tick()
            tick += 1
        raise AssertionError(f"not finished in {max_ticks} ticks: {self.saved.migration}")

    def _advance(self, record: Record) -> Result:
        obs = self.world.observe(record.migration, record.actions)
        return advance(record.migration, obs, self.world.now_s, self.limits)


def start(script: Script) -> tuple[World, Migration]:
    world = World(script)
    m = Migration.planned(
        id="mig-1",
        job_id="job-a",
        src_offer_id=SRC,
        dst_offer_id=DST,
        src_instance_id="src-0" if script.src_alive else "",
        now_s=world.now_s,
    )
    return world, m
