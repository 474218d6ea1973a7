"""The migration machine as a table: (phase, what was seen, time in phase) -> (next phase,
actions). Every edge of TRANSITIONS and every failure route appears at least once."""

from __future__ import annotations

import typing
import uuid
from dataclasses import dataclass, replace

import pytest

from orchestrator.migration import (
    TERMINAL,
    TRANSITIONS,
    CheckpointSeen,
    CopyCheckpoint,
    Launch,
    Limits,
    Migration,
    MigrationAction,
    MigrationError,
    MigrationPhase,
    Observation,
    RequestCheckpoint,
    Terminate,
    advance,
)
from providers.base import FailureKind, InstanceState

P = MigrationPhase
SRC, DST = "aws:us-east-1a:p3.2xlarge:spot", "gcp:europe-west4-a:a2-ultragpu-1g:spot"
T = 1_700_000_000.0
LIMITS = Limits(
    checkpoint_timeout_s=600,
    stop_grace_s=120,
    copy_timeout_s=600,
    provision_timeout_s=600,
    restore_timeout_s=600,
    rollback_timeout_s=600,
    max_attempts=3,
)

OLD = CheckpointSeen("s3://src/job/ckpt-10", 10, T - 600, verified=True)  # before the start
FRESH = CheckpointSeen("s3://src/job/ckpt-15", 15, T + 5, verified=True)  # written when asked
TORN = replace(FRESH, verified=False)  # sizes or sha256 do not match the manifest
COPY = CheckpointSeen("gs://dst/job/ckpt-15", 15, T + 5, verified=True)
STALE_COPY = CheckpointSeen("gs://dst/job/ckpt-10", 10, T - 600, verified=True)  # older move
RAN = CheckpointSeen("gs://dst/job/ckpt-20", 20, T + 60, verified=True)  # written after restore
SRC_RAN = CheckpointSeen("s3://src/job/ckpt-20", 20, T + 60, verified=True)  # by a relaunch
BOOTING, RUNNING = InstanceState.BOOTING, InstanceState.RUNNING
PREEMPTED, TERMINATED = InstanceState.PREEMPTED, InstanceState.TERMINATED


def mig(phase: MigrationPhase, **changes: typing.Any) -> Migration:
    """A migration in `phase` with what the earlier phases would have recorded."""
    order = list(P)
    m = Migration(
        id="mig-1",
        job_id="job-a",
        src_offer_id=SRC,
        dst_offer_id=DST,
        started_s=T,
        updated_s=T,
        src_instance_id="src-0",
        phase=phase,
    )
    if phase is not P.PLANNED and phase is not P.CHECKPOINTING:
        m = replace(m, src_checkpoint_uri=FRESH.uri, checkpoint_step=FRESH.step)
    if order.index(phase) >= order.index(P.PROVISIONING):
        m = replace(m, dst_checkpoint_uri=COPY.uri)
    if phase in (P.RUNNING, P.RESTORING, P.DONE):
        m = replace(m, dst_instance_id="dst-1")
    return replace(m, **changes)


def seen(**kw: typing.Any) -> Observation:
    return Observation(**kw)


@dataclass(frozen=True)
class Case:
    name: str
    m: Migration
    obs: Observation
    after_s: float  # seconds since the phase (or retry) began
    phase: MigrationPhase
    actions: tuple[type, ...]
    attempt: int = 0


RB = {"src_instance_id": ""}  # rolling back with a relaunch at the source under way
CASES = [
    # --- PLANNED ---
    Case(
        "live source is asked to checkpoint and stop",
        mig(P.PLANNED),
        seen(src_instance_alive=True, src_checkpoint=OLD),
        0,
        P.CHECKPOINTING,
        (RequestCheckpoint,),
    ),
    Case(
        "no instance: the newest verified checkpoint moves",
        mig(P.PLANNED, src_instance_id=""),
        seen(src_checkpoint=OLD),
        0,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "instance already gone counts as none",
        mig(P.PLANNED),
        seen(src_instance_alive=False, src_checkpoint=OLD),
        0,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "no instance, only a torn checkpoint: nothing to move",
        mig(P.PLANNED, src_instance_id=""),
        seen(src_checkpoint=TORN),
        0,
        P.FAILED,
        (),
    ),
    Case(
        "no instance, no checkpoint: nothing to move",
        mig(P.PLANNED, src_instance_id=""),
        seen(),
        0,
        P.FAILED,
        (),
    ),
    Case(
        "the job finished before the move began: nothing to move",
        mig(P.PLANNED),
        seen(src_instance_alive=True, src_checkpoint=OLD, job_finished=True),
        0,
        P.FAILED,
        (),
    ),
    Case(
        "the job finished while asked to checkpoint: nothing to move",
        mig(P.CHECKPOINTING),
        seen(src_checkpoint=FRESH, job_finished=True),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "the job finished before it stopped, copy under way: nothing to move",
        mig(P.COPYING),
        seen(job_finished=True),
        30,
        P.FAILED,
        (),
    ),
    # --- CHECKPOINTING ---
    Case(
        "keeps asking until a new checkpoint exists",
        mig(P.CHECKPOINTING),
        seen(src_instance_alive=True),
        30,
        P.CHECKPOINTING,
        (RequestCheckpoint,),
    ),
    Case(
        "a checkpoint from before the start does not count",
        mig(P.CHECKPOINTING),
        seen(src_instance_alive=True, src_checkpoint=OLD),
        30,
        P.CHECKPOINTING,
        (RequestCheckpoint,),
    ),
    Case(
        "new verified checkpoint and the source stopped: copy it",
        mig(P.CHECKPOINTING),
        seen(src_checkpoint=FRESH),
        30,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "a torn new checkpoint does not count",
        mig(P.CHECKPOINTING),
        seen(src_checkpoint=TORN),
        30,
        P.CHECKPOINTING,
        (),
    ),
    Case(
        "checkpointed, still running, within the grace period",
        mig(P.CHECKPOINTING),
        seen(src_instance_alive=True, src_checkpoint=FRESH),
        60,
        P.CHECKPOINTING,
        (),
    ),
    Case(
        "checkpointed, still running after the grace period: terminate it",
        mig(P.CHECKPOINTING),
        seen(src_instance_alive=True, src_checkpoint=FRESH),
        200,
        P.CHECKPOINTING,
        (Terminate,),
    ),
    Case(
        "did not checkpoint in time, still alive: roll back, it keeps its place",
        mig(P.CHECKPOINTING),
        seen(src_instance_alive=True, src_checkpoint=OLD),
        600,
        P.ROLLING_BACK,
        (),
    ),
    Case(
        "source died without a new checkpoint: after the timeout the old one moves",
        mig(P.CHECKPOINTING),
        seen(src_checkpoint=OLD),
        600,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "source died, no checkpoint ever: roll back, relaunch from the start",
        mig(P.CHECKPOINTING),
        seen(),
        600,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "source died, waits for a late checkpoint before the timeout",
        mig(P.CHECKPOINTING),
        seen(src_checkpoint=OLD),
        300,
        P.CHECKPOINTING,
        (),
    ),
    # --- COPYING ---
    Case(
        "copies until the copy verifies",
        mig(P.COPYING),
        seen(src_checkpoint=FRESH),
        30,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "a copy from an older migration does not count",
        mig(P.COPYING),
        seen(dst_checkpoint=STALE_COPY),
        30,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "a torn copy does not count",
        mig(P.COPYING),
        seen(dst_checkpoint=replace(COPY, verified=False)),
        30,
        P.COPYING,
        (CopyCheckpoint,),
    ),
    Case(
        "verified copy: launch at the destination",
        mig(P.COPYING),
        seen(dst_checkpoint=COPY),
        30,
        P.PROVISIONING,
        (Launch,),
    ),
    Case(
        "copy error: retry",
        mig(P.COPYING),
        seen(copy_error="connection reset"),
        30,
        P.COPYING,
        (CopyCheckpoint,),
        attempt=1,
    ),
    Case(
        "copy timeout: retry", mig(P.COPYING), seen(), 600, P.COPYING, (CopyCheckpoint,), attempt=1
    ),
    Case(
        "copy error on the last attempt: roll back",
        mig(P.COPYING, attempt=2),
        seen(copy_error="connection reset"),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "copy timeout on the last attempt: roll back",
        mig(P.COPYING, attempt=2),
        seen(),
        600,
        P.ROLLING_BACK,
        (Launch,),
    ),
    # --- PROVISIONING ---
    Case(
        "launches until the instance shows up",
        mig(P.PROVISIONING),
        seen(),
        30,
        P.PROVISIONING,
        (Launch,),
    ),
    Case(
        "instance booting: restoring",
        mig(P.PROVISIONING),
        seen(dst_instance_id="dst-1", dst_state=BOOTING),
        30,
        P.RESTORING,
        (),
    ),
    Case(
        "instance running: restoring",
        mig(P.PROVISIONING),
        seen(dst_instance_id="dst-1", dst_state=RUNNING),
        30,
        P.RESTORING,
        (),
    ),
    Case(
        "instance ended after a newer checkpoint (it ran unwatched): restoring",
        mig(P.PROVISIONING),
        seen(dst_instance_id="dst-1", dst_state=TERMINATED, dst_checkpoint=RAN),
        30,
        P.RESTORING,
        (),
    ),
    Case(
        "transient launch error: retry",
        mig(P.PROVISIONING),
        seen(launch_error=FailureKind.TRANSIENT),
        30,
        P.PROVISIONING,
        (Launch,),
        attempt=1,
    ),
    Case(
        "transient launch error on the last attempt: roll back",
        mig(P.PROVISIONING, attempt=2),
        seen(launch_error=FailureKind.TRANSIENT),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    *[
        Case(
            f"launch refused ({kind}): roll back",
            mig(P.PROVISIONING),
            seen(launch_error=kind),
            30,
            P.ROLLING_BACK,
            (Launch,),
        )
        for kind in (FailureKind.CAPACITY, FailureKind.QUOTA, FailureKind.AUTH, FailureKind.INVALID)
    ],
    Case(
        "preempted before it booted: roll back",
        mig(P.PROVISIONING),
        seen(dst_instance_id="dst-1", dst_state=PREEMPTED),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "terminated before it booted: roll back",
        mig(P.PROVISIONING),
        seen(dst_instance_id="dst-1", dst_state=TERMINATED),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "no instance in time: roll back",
        mig(P.PROVISIONING),
        seen(),
        600,
        P.ROLLING_BACK,
        (Launch,),
    ),
    # --- RESTORING ---
    Case(
        "waits for progress",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=RUNNING),
        30,
        P.RESTORING,
        (),
    ),
    Case(
        "progress after restore: running",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=RUNNING, dst_progress_after_restore=True),
        30,
        P.RUNNING,
        (),
    ),
    Case(
        "preempted while restoring: roll back",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=PREEMPTED),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "terminated while restoring (the job crashed): roll back",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=TERMINATED),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "terminated with only the moved checkpoint there: roll back",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=TERMINATED, dst_checkpoint=COPY),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "ended after a newer checkpoint there (it finished unwatched): running",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=TERMINATED, dst_checkpoint=RAN),
        30,
        P.RUNNING,
        (),
    ),
    Case(
        "a torn newer checkpoint proves nothing: roll back",
        mig(P.RESTORING),
        seen(
            dst_instance_id="dst-1",
            dst_state=PREEMPTED,
            dst_checkpoint=replace(RAN, verified=False),
        ),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "no progress in time: roll back, terminating it",
        mig(P.RESTORING),
        seen(dst_instance_id="dst-1", dst_state=RUNNING),
        600,
        P.ROLLING_BACK,
        (Terminate, Launch),
    ),
    # --- RUNNING ---
    Case(
        "arrived: done, the source checkpoint is kept",
        mig(P.RUNNING),
        seen(dst_instance_id="dst-1", dst_state=RUNNING, dst_progress_after_restore=True),
        30,
        P.DONE,
        (),
    ),
    # --- ROLLING_BACK ---
    Case(
        "relaunches at the source until the instance shows up",
        mig(P.ROLLING_BACK, **RB),
        seen(),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "terminates a live destination instance",
        mig(P.ROLLING_BACK, **RB),
        seen(dst_instance_id="dst-1", dst_state=RUNNING),
        30,
        P.ROLLING_BACK,
        (Terminate, Launch),
    ),
    Case(
        "rollback instance booting: wait",
        mig(P.ROLLING_BACK, **RB),
        seen(rollback_instance_id="src-1", rollback_state=BOOTING),
        30,
        P.ROLLING_BACK,
        (),
    ),
    Case(
        "rollback instance running, destination gone: failed, job safe",
        mig(P.ROLLING_BACK, **RB),
        seen(
            rollback_instance_id="src-1",
            rollback_state=RUNNING,
            dst_instance_id="dst-1",
            dst_state=TERMINATED,
        ),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "rollback instance running, destination alive: terminate it first",
        mig(P.ROLLING_BACK, **RB),
        seen(
            rollback_instance_id="src-1",
            rollback_state=RUNNING,
            dst_instance_id="dst-1",
            dst_state=RUNNING,
        ),
        30,
        P.ROLLING_BACK,
        (Terminate,),
    ),
    Case(
        "the original instance never stopped: failed at once",
        mig(P.ROLLING_BACK),
        seen(src_instance_alive=True),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "the original instance stopped meanwhile: relaunch",
        mig(P.ROLLING_BACK),
        seen(src_instance_alive=False, src_checkpoint=FRESH),
        30,
        P.ROLLING_BACK,
        (Launch,),
    ),
    Case(
        "rollback launch without capacity: retry",
        mig(P.ROLLING_BACK, **RB),
        seen(launch_error=FailureKind.CAPACITY),
        30,
        P.ROLLING_BACK,
        (Launch,),
        attempt=1,
    ),
    Case(
        "rollback instance preempted: retry",
        mig(P.ROLLING_BACK, **RB),
        seen(rollback_instance_id="src-1", rollback_state=PREEMPTED),
        30,
        P.ROLLING_BACK,
        (Launch,),
        attempt=1,
    ),
    Case(
        "rollback instance ended after running (finished unseen): failed, job safe, no relaunch",
        mig(P.ROLLING_BACK, **RB),
        seen(rollback_instance_id="src-1", rollback_state=TERMINATED, src_checkpoint=SRC_RAN),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "rollback instance preempted after running: failed, the loop re-plans",
        mig(P.ROLLING_BACK, **RB),
        seen(rollback_instance_id="src-1", rollback_state=PREEMPTED, src_checkpoint=SRC_RAN),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "the job finished on the rollback instance: failed, job safe, no relaunch",
        mig(P.ROLLING_BACK, **RB),
        seen(
            rollback_instance_id="src-1",
            rollback_state=TERMINATED,
            src_checkpoint=FRESH,
            job_finished=True,
        ),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "rollback instance ended with no newer checkpoint: retry",
        mig(P.ROLLING_BACK, **RB),
        seen(rollback_instance_id="src-1", rollback_state=TERMINATED, src_checkpoint=FRESH),
        30,
        P.ROLLING_BACK,
        (Launch,),
        attempt=1,
    ),
    Case(
        "rollback launch over quota: failed, the job holds no instance",
        mig(P.ROLLING_BACK, **RB),
        seen(launch_error=FailureKind.QUOTA),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "rollback launch fails on the last attempt: failed",
        mig(P.ROLLING_BACK, attempt=2, **RB),
        seen(launch_error=FailureKind.TRANSIENT),
        30,
        P.FAILED,
        (),
    ),
    Case(
        "rollback out of time: failed, still terminating the destination",
        mig(P.ROLLING_BACK, **RB),
        seen(
            dst_instance_id="dst-1",
            dst_state=RUNNING,
            rollback_instance_id="src-1",
            rollback_state=RUNNING,
        ),
        600,
        P.FAILED,
        (Terminate,),
    ),
    # --- terminal ---
    Case("done stays done", mig(P.DONE), seen(dst_state=PREEMPTED), 10_000, P.DONE, ()),
    Case(
        "failed stays failed",
        mig(P.FAILED),
        seen(launch_error=FailureKind.AUTH),
        10_000,
        P.FAILED,
        (),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_step(case: Case) -> None:
    m, actions = advance(case.m, case.obs, case.m.updated_s + case.after_s, LIMITS)
    assert m.phase is case.phase
    assert tuple(type(a) for a in actions) == case.actions
    assert m.attempt == case.attempt
    assert advance(case.m, case.obs, case.m.updated_s + case.after_s, LIMITS) == (m, actions)
    if m.phase is not case.m.phase:
        assert m.phase in TRANSITIONS[case.m.phase]
        assert m.updated_s == case.m.updated_s + case.after_s
    for a in actions:  # request ids are the migration's, for this step and attempt
        assert uuid.UUID(a.request_id).version == 5


def test_every_edge_has_a_case() -> None:
    covered = {(c.m.phase, c.phase) for c in CASES if c.phase is not c.m.phase}
    edges = {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts}
    assert covered == edges


def test_actions_carry_the_right_targets() -> None:
    _, [ask] = advance(mig(P.PLANNED), seen(src_instance_alive=True), T, LIMITS)
    assert ask == RequestCheckpoint("src-0", ask.request_id)
    m, [copy] = advance(mig(P.CHECKPOINTING), seen(src_checkpoint=FRESH), T + 30, LIMITS)
    assert copy == CopyCheckpoint(FRESH.uri, DST, m.request_id("copy"))
    assert (m.src_checkpoint_uri, m.checkpoint_step) == (FRESH.uri, FRESH.step)
    m, [launch] = advance(mig(P.COPYING), seen(dst_checkpoint=COPY), T + 30, LIMITS)
    assert launch == Launch(DST, COPY.uri, m.request_id("launch"))
    assert m.dst_checkpoint_uri == COPY.uri
    # a rollback relaunches from the newest verified source checkpoint it can see
    m, [back] = advance(
        mig(P.COPYING, attempt=2), seen(copy_error="x", src_checkpoint=FRESH), T + 30, LIMITS
    )
    assert back == Launch(SRC, FRESH.uri, m.request_id("rollback"))
    m, [stop, back] = advance(
        mig(P.RESTORING), seen(dst_instance_id="dst-1", dst_state=RUNNING), T + 600, LIMITS
    )
    assert stop == Terminate("dst-1", stop.request_id)
    assert m.dst_instance_id == "dst-1"


def test_retries_get_new_request_ids_and_waits_keep_them() -> None:
    m = mig(P.COPYING)
    _, [first] = advance(m, seen(), T + 10, LIMITS)
    _, [again] = advance(m, seen(), T + 20, LIMITS)
    retried, [second] = advance(m, seen(copy_error="reset"), T + 30, LIMITS)
    assert first == again
    assert second.request_id != first.request_id
    assert retried.updated_s == T + 30  # the retry's timeout counts from now
    assert "reset" in retried.error


def test_failed_records_where_the_job_runs_and_why() -> None:
    m, _ = advance(mig(P.PROVISIONING), seen(launch_error=FailureKind.CAPACITY), T + 10, LIMITS)
    assert "capacity" in m.error
    m, _ = advance(m, seen(rollback_instance_id="src-1", rollback_state=RUNNING), T + 20, LIMITS)
    assert (m.phase, m.src_instance_id) == (P.FAILED, "src-1")
    assert "capacity" in m.error
    stuck, _ = advance(mig(P.ROLLING_BACK, **RB), seen(launch_error=FailureKind.AUTH), T, LIMITS)
    assert "holds no instance" in stuck.error and FRESH.uri in stuck.error


def test_a_rollback_instance_that_ran_stays_the_jobs() -> None:
    """A relaunch that restored, ran and ended between two observations is where the job
    ran: the failed migration names it, and no second relaunch is asked for."""
    m, [launch] = advance(mig(P.PROVISIONING), seen(launch_error=FailureKind.CAPACITY), T, LIMITS)
    assert isinstance(launch, Launch) and launch.checkpoint_uri == FRESH.uri
    gone = seen(rollback_instance_id="src-1", rollback_state=TERMINATED, src_checkpoint=SRC_RAN)
    m, actions = advance(m, gone, T + 10, LIMITS)
    assert (m.phase, m.src_instance_id, actions) == (P.FAILED, "src-1", [])


def test_rollback_checkpoint_is_fixed_once_decided() -> None:
    """A newer checkpoint seen after the rollback launch was asked for does not change it."""
    m, [launch] = advance(mig(P.PROVISIONING), seen(launch_error=FailureKind.QUOTA), T, LIMITS)
    newer = CheckpointSeen("s3://src/job/ckpt-99", 99, T + 50, verified=True)
    _, [again] = advance(m, seen(src_checkpoint=newer), T + 10, LIMITS)
    assert again == launch


def test_request_ids() -> None:
    m = mig(P.COPYING)
    rid = m.request_id("copy")
    assert rid == mig(P.COPYING).request_id("copy")
    assert uuid.UUID(rid).version == 5  # GCP wants a UUID; AWS takes it as a client token
    assert (
        len(
            {
                rid,
                m.request_id("launch"),
                replace(m, attempt=1).request_id("copy"),
                replace(m, id="mig-2").request_id("copy"),
            }
        )
        == 4
    )


def test_table_shape() -> None:
    assert set(TRANSITIONS) == set(P)
    assert {P.DONE, P.FAILED} == TERMINAL
    working = [P.CHECKPOINTING, P.COPYING, P.PROVISIONING, P.RESTORING]
    for p in working:
        assert P.ROLLING_BACK in TRANSITIONS[p]
    # from every non-terminal phase both a terminal outcome and FAILED are reachable
    for p in set(P) - TERMINAL:
        reach: set[MigrationPhase] = set()
        todo = [p]
        while todo:
            for q in TRANSITIONS[todo.pop()] - reach:
                reach.add(q)
                todo.append(q)
        assert P.FAILED in reach or p is P.RUNNING, p
        assert reach & TERMINAL
        assert p not in reach  # no cycles: each phase is entered at most once


def test_no_action_deletes_a_checkpoint() -> None:
    assert set(typing.get_args(MigrationAction)) == {
        RequestCheckpoint,
        CopyCheckpoint,
        Launch,
        Terminate,
    }


def test_bad_records_are_refused() -> None:
    with pytest.raises(MigrationError, match="both"):
        mig(P.PLANNED, dst_offer_id=SRC)
    with pytest.raises(MigrationError):
        Limits(max_attempts=0)
