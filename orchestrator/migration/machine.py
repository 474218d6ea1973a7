"""The migration state machine: one table of phases and a pure `advance`.

A migration moves one job from the offer it runs on (`src`) to another offer (`dst`):

    PLANNED -> CHECKPOINTING -> COPYING -> PROVISIONING -> RESTORING -> RUNNING -> DONE
                    |              |            |              |
                    +--------------+------------+--------------+--> ROLLING_BACK -> FAILED

`advance(migration, observation, now_s)` is a function: no I/O, no clock, no randomness.
It reads what the controller saw this tick and returns the next migration record and the
side effects still needed, as data (`RequestCheckpoint`, `CopyCheckpoint`, `Launch`,
`Terminate`). There is no action that deletes a checkpoint: retention lives elsewhere and
the checkpoint a migration moved is never its business to remove.

Actions are level-triggered. While a phase's goal is not yet observed, every tick returns
the same actions with the same request ids (`Migration.request_id(step)`, a UUID derived
from the migration id, the step and the attempt; a UUID because GCP requires one and AWS
accepts it as a client token). A new request id appears only when the attempt changes; a
launch is retried only once the previous one is known to have left no live instance (a copy
retry may overlap the previous copy: both write the same verified bytes).

Controller protocol (the caller's job):

0. On start-up, perform the actions saved with each open migration's record again: the
   controller may have died before performing them.
Then, once per tick:
1. Load the migration record `m` and the actions saved with it.
2. Observe the world into an `Observation` (see its contract), reporting the outcome of the
   actions saved with `m`: those are the requests the machine is waiting on.
3. `m2, actions = advance(m, obs, now_s)`.
4. Save `m2` with `actions` in one commit, guarded by the record's version ("before").
5. Perform the actions, each idempotent by its request id (provider launch and checkpoint
   copy by contract, terminate by nature, checkpoint requests deduplicated by the executor);
   record what came back (instance ids, failures) as events ("after").

A controller killed anywhere resumes from the last saved record: killed before 4, nothing
was saved and the same inputs give the same step; killed between 4 and 5, step 0 performs
the saved requests, and while their effect is not observed every later tick returns them
again with the same ids, so each runs once; killed during or after 5, repeating a request
is a no-op. Step 0 matters most for actions saved with a terminal record (a rollback that
ends FAILED still terminating the destination): terminal records emit nothing again.

Why a step stays, retries or rolls back (`attempt` counts tries of the current phase's
step, from 0, and is reset on every phase change; a retry needs `attempt + 1 < max_attempts`):

| cause                                    | phase          | choice                         |
|------------------------------------------|----------------|--------------------------------|
| job did not checkpoint and stop in time  | CHECKPOINTING  | roll back (asking again would  |
|                                          |                | only repeat the same signal)   |
| source died with no new checkpoint       | CHECKPOINTING  | after the timeout, move its    |
|                                          |                | newest older verified one      |
| copy failed / did not verify in time     | COPYING        | retry (copies are resumable    |
|                                          |                | and idempotent), then roll back|
| launch TRANSIENT (throttled, timed out)  | PROVISIONING   | retry: no instance was made    |
| launch CAPACITY                          | PROVISIONING   | roll back: capacity stays gone |
|                                          |                | for minutes to hours while the |
|                                          |                | job sits idle; the policy      |
|                                          |                | re-plans on fresh capacity     |
| launch QUOTA / AUTH / INVALID            | PROVISIONING   | roll back: needs a person      |
| instance not booting in time             | PROVISIONING   | roll back: a relaunch could    |
|                                          |                | race an instance still coming  |
| destination preempted or terminated      | PROVISIONING,  | roll back: a reclaim right     |
|                                          | RESTORING      | after launch says that market  |
|                                          |                | is hot; a crash on restore     |
|                                          |                | would repeat                   |
| ... after writing a checkpoint newer     | PROVISIONING,  | go on (to RUNNING): it         |
| than the one moved (it finished, or it   | RESTORING      | restored and ran there, and    |
| ran while the controller was down)       |                | what became of it since is the |
|                                          |                | loop's, as after RUNNING       |
| no progress after restore in time        | RESTORING      | roll back                      |
| rollback launch TRANSIENT / CAPACITY,    | ROLLING_BACK   | retry: the job has nowhere     |
| rollback instance lost                   |                | else to go; then FAILED        |
| rollback launch QUOTA / AUTH / INVALID   | ROLLING_BACK   | FAILED at once                 |
| rollback not finished in time            | ROLLING_BACK   | FAILED, naming what is left    |
| rollback instance ended after writing a  | ROLLING_BACK   | FAILED, the job safe: it ran   |
| checkpoint newer than the one it         |                | at the source, and what became |
| restored (or the job finished) before it |                | of it is the loop's; no        |
| was seen running                         |                | relaunch                       |

Rolling back stops whatever the migration started at the destination and gives the job an
instance at the source: the original one if it is still alive (the job never stopped), else
a relaunch from the newest verified checkpoint (or from the start if none was ever
verified). FAILED means the migration failed and the job is safe: it runs at the source, or
(only when the source cannot be relaunched) it holds no instance and its checkpoints are
all kept, and `error` says so.

Invariants (tested in tests/migration/): every phase change follows `TRANSITIONS`; at most
one Launch request per (target offer, attempt); a Launch at the destination only after its
copy of the checkpoint verified; a Terminate of the source instance only after a verified
checkpoint written since the migration started.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType
from typing import TypeAlias

from orchestrator.errors import PermanentError
from orchestrator.model import InstanceId, JobId, OfferId
from providers.base import FailureKind, InstanceState


class MigrationPhase(StrEnum):
    PLANNED = "planned"  # decided, nothing done yet
    CHECKPOINTING = "checkpointing"  # the job was asked to checkpoint and stop
    COPYING = "copying"  # the checkpoint is being copied to the destination's store
    PROVISIONING = "provisioning"  # an instance was requested at the destination
    RESTORING = "restoring"  # it boots and restores the checkpoint
    RUNNING = "running"  # the job made progress at the destination
    DONE = "done"  # terminal: the job lives at the destination
    ROLLING_BACK = "rolling_back"  # undoing: stop the destination, run at the source
    FAILED = "failed"  # terminal: the migration failed, the job is safe


_P = MigrationPhase

# Valid phase changes, one line per edge with the reason it exists. `advance` enforces this
# table. Staying in the same phase (waiting, or retrying with attempt + 1) is not a change.
TRANSITIONS: Mapping[MigrationPhase, frozenset[MigrationPhase]] = MappingProxyType(
    {
        _P.PLANNED: frozenset(
            {
                # The job has a live instance: ask it to write a checkpoint and stop.
                _P.CHECKPOINTING,
                # The job holds no instance (preempted, paused): there is nobody to ask, so its
                # newest verified checkpoint is what moves.
                _P.COPYING,
                # No live instance and no verified checkpoint, or the job already finished: nothing
                # to move and nothing has been changed, so there is nothing to roll back.
                _P.FAILED,
            }
        ),
        _P.CHECKPOINTING: frozenset(
            {
                # A verified checkpoint written since the migration started exists and the source
                # has stopped; or the source died without one and the timeout passed, so its newest
                # older verified checkpoint moves (going back would lose the same work).
                _P.COPYING,
                # The job did not checkpoint and stop in time: give it back its place.
                _P.ROLLING_BACK,
                # The job finished its work at the source: nothing is left to move (no destination
                # instance exists yet, so there is nothing to undo either).
                _P.FAILED,
            }
        ),
        _P.COPYING: frozenset(
            {
                # The destination's copy verified, at the step the source wrote: launch there.
                _P.PROVISIONING,
                # The copy failed or did not verify in time on its last attempt.
                _P.ROLLING_BACK,
                # The job had finished at the source before it stopped: nothing is left to move.
                _P.FAILED,
            }
        ),
        _P.PROVISIONING: frozenset(
            {
                # The destination instance exists and is booting or running; or it has already
                # restored and written a newer checkpoint there (it may even have finished while
                # the controller was down).
                _P.RESTORING,
                # The launch was refused (capacity, quota, auth, invalid; transient ones after the
                # last attempt), the instance was lost before booting, or it never appeared in time.
                _P.ROLLING_BACK,
            }
        ),
        _P.RESTORING: frozenset(
            {
                # The job reported progress on the new instance, or wrote a checkpoint newer than
                # the one moved into the destination's store: the restore worked.
                _P.RUNNING,
                # The instance was preempted or terminated while restoring, or made no progress in
                # time.
                _P.ROLLING_BACK,
            }
        ),
        _P.RUNNING: frozenset(
            {
                # Nothing is left to do: the source stopped before the copy and its checkpoint
                # is kept (retention is elsewhere). A later preemption is the loop's, not a
                # migration's.
                _P.DONE,
            }
        ),
        _P.ROLLING_BACK: frozenset(
            {
                # The job runs at the source again and no destination instance is alive; or the
                # source cannot be relaunched, or the rollback ran out of time (`error` says what).
                _P.FAILED,
            }
        ),
        # Terminal.
        _P.DONE: frozenset(),
        # Terminal.
        _P.FAILED: frozenset(),
    }
)

TERMINAL: frozenset[MigrationPhase] = frozenset(p for p, nxt in TRANSITIONS.items() if not nxt)

_LIVE = frozenset({InstanceState.BOOTING, InstanceState.RUNNING})
_GONE = frozenset({InstanceState.TERMINATED, InstanceState.PREEMPTED})
_PERMANENT = frozenset({FailureKind.QUOTA, FailureKind.AUTH, FailureKind.INVALID})
_REQUEST_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "heliotrope:migration")


class MigrationError(PermanentError):
    """A migration record that cannot exist, or a phase change the table forbids (a bug)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Migration:
    """One migration, as stored. Changed only by `advance`, which returns a new record.

    `src_instance_id` is the job's instance at the source: "" when the job holds none (after
    a preemption; or while a rollback relaunch is pending), the relaunched one after a
    rollback. `src_checkpoint_uri` / `checkpoint_step` name the verified checkpoint the
    migration moves (a rollback relaunches from it, or from a newer verified one);
    `dst_checkpoint_uri` its verified copy at the destination. `updated_s` is when the
    current phase (or retry) began: timeouts count from it. `error` is the most recent
    failure seen, kept after a successful retry.
    """

    id: str
    job_id: JobId
    src_offer_id: OfferId
    dst_offer_id: OfferId
    started_s: float
    updated_s: float
    src_instance_id: InstanceId = ""
    dst_instance_id: InstanceId = ""
    src_checkpoint_uri: str = ""
    checkpoint_step: int = -1
    dst_checkpoint_uri: str = ""
    phase: MigrationPhase = MigrationPhase.PLANNED
    attempt: int = 0
    error: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            raise MigrationError("a migration needs an id (request ids derive from it)")
        if self.src_offer_id == self.dst_offer_id:
            raise MigrationError(
                f"migration {self.id}: source and destination are both {self.src_offer_id}"
            )
        if self.attempt < 0:
            raise MigrationError(f"migration {self.id}: attempt {self.attempt} < 0")

    @staticmethod
    def planned(
        *,
        id: str,
        job_id: JobId,
        src_offer_id: OfferId,
        dst_offer_id: OfferId,
        src_instance_id: InstanceId,
        now_s: float,
    ) -> Migration:
        """A new migration in PLANNED, started now."""
        return Migration(
            id=id,
            job_id=job_id,
            src_offer_id=src_offer_id,
            dst_offer_id=dst_offer_id,
            src_instance_id=src_instance_id,
            started_s=now_s,
            updated_s=now_s,
        )

    def request_id(self, step: str) -> str:
        """The request id of `step` at this attempt: a UUID, the same for the same inputs."""
        return str(uuid.uuid5(_REQUEST_NAMESPACE, f"{self.id}/{step}/{self.attempt}"))

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL


@dataclass(frozen=True, slots=True)
class CheckpointSeen:
    """A checkpoint as its store lists it; `verified`: its manifest's sizes and sha256 check."""

    uri: str
    step: int
    created_at_s: float
    verified: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What the controller saw this tick, for one migration.

    - `src_instance_alive`: `Migration.src_instance_id` is booting or running.
    - `src_checkpoint` / `dst_checkpoint`: the newest checkpoint of the job in the source's
      / destination's store (the store skips corrupt ones in favour of the newest verified).
      A verified `dst_checkpoint` newer than the one moved proves that the job restored and
      ran at the destination, durably: it holds after a controller restart, and after the
      instance has ended (finished, say, while no controller was watching).
    - `dst_instance_id` / `dst_state`: the instance this migration launched at the
      destination ("" / None: none known); `dst_progress_after_restore`: the job reported
      progress on it after restoring.
    - `rollback_instance_id` / `rollback_state`: the instance a rollback launched at the
      source.
    - `launch_error` / `copy_error`: the failure of the Launch / CopyCheckpoint saved with
      the migration (the requests it waits on); None when it has not failed or has not
      been performed yet. An older request's failure must not be reported.
    - `job_finished`: the job completed its work (at the source: a migration that has not
      launched at the destination yet has nothing left to move).
    """

    src_instance_alive: bool = False
    src_checkpoint: CheckpointSeen | None = None
    dst_checkpoint: CheckpointSeen | None = None
    dst_instance_id: InstanceId = ""
    dst_state: InstanceState | None = None
    dst_progress_after_restore: bool = False
    launch_error: FailureKind | None = None
    copy_error: str | None = None
    rollback_instance_id: InstanceId = ""
    rollback_state: InstanceState | None = None
    job_finished: bool = False


@dataclass(frozen=True, slots=True)
class RequestCheckpoint:
    """Ask the job on `instance_id` to write a checkpoint and stop (as on a preemption
    notice: SIGTERM locally)."""

    instance_id: InstanceId
    request_id: str


@dataclass(frozen=True, slots=True)
class CopyCheckpoint:
    """Copy the checkpoint at `src_uri` into the store of `dst_offer_id`'s region."""

    src_uri: str
    dst_offer_id: OfferId
    request_id: str


@dataclass(frozen=True, slots=True)
class Launch:
    """Start the job on one instance of `offer_id`, restoring `checkpoint_uri` ("" only
    when no checkpoint was ever verified: start from the beginning)."""

    offer_id: OfferId
    checkpoint_uri: str
    request_id: str


@dataclass(frozen=True, slots=True)
class Terminate:
    instance_id: InstanceId
    request_id: str


MigrationAction: TypeAlias = RequestCheckpoint | CopyCheckpoint | Launch | Terminate


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Timeouts per phase (seconds since the phase or retry began) and tries per step.

    `stop_grace_s`: how long the source may keep running after writing its new verified
    checkpoint before it is terminated.
    """

    checkpoint_timeout_s: float = 900.0
    stop_grace_s: float = 120.0
    copy_timeout_s: float = 3600.0
    provision_timeout_s: float = 900.0
    restore_timeout_s: float = 1800.0
    rollback_timeout_s: float = 1800.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise MigrationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in (
            "checkpoint_timeout_s",
            "stop_grace_s",
            "copy_timeout_s",
            "provision_timeout_s",
            "restore_timeout_s",
            "rollback_timeout_s",
        ):
            if not getattr(self, name) >= 0:
                raise MigrationError(f"{name} must be a number of seconds >= 0")

    def timeout_s(self, phase: MigrationPhase) -> float:
        """The time `phase` may take; inf for phases that never wait."""
        return {
            _P.CHECKPOINTING: self.checkpoint_timeout_s,
            _P.COPYING: self.copy_timeout_s,
            _P.PROVISIONING: self.provision_timeout_s,
            _P.RESTORING: self.restore_timeout_s,
            _P.ROLLING_BACK: self.rollback_timeout_s,
        }.get(phase, float("inf"))


DEFAULT_LIMITS = Limits()

Result: TypeAlias = tuple[Migration, list[MigrationAction]]
Step: TypeAlias = Callable[[Migration, Observation, float, Limits], Result]


def advance(
    m: Migration, obs: Observation, now_s: float, limits: Limits = DEFAULT_LIMITS
) -> Result:
    """One step of `m` given what was seen at `now_s`: the next record and the actions to
    perform. Pure; at most one phase change per call, always an edge of `TRANSITIONS`."""
    return _STEPS[m.phase](m, obs, now_s, limits)


# --- steps, one per phase ---------------------------------------------------------------


_FINISHED = "the job finished at the source before it moved: nothing to move"
NOTHING_TO_MOVE = "the job holds no live instance and has no verified checkpoint: nothing to move"


def _planned(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    if obs.job_finished:
        return _to(replace(m, error=_FINISHED), _P.FAILED, now_s), []
    if _src_alive(m, obs):
        nxt = _to(m, _P.CHECKPOINTING, now_s)
        return nxt, [RequestCheckpoint(m.src_instance_id, nxt.request_id("checkpoint"))]
    ck = _verified(obs.src_checkpoint)
    if ck is not None:
        nxt = _to(replace(m, src_checkpoint_uri=ck.uri, checkpoint_step=ck.step), _P.COPYING, now_s)
        return nxt, [_copy(nxt)]
    return _to(replace(m, error=NOTHING_TO_MOVE), _P.FAILED, now_s), []


def _checkpointing(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    if obs.job_finished:
        return _to(replace(m, error=_FINISHED), _P.FAILED, now_s), []
    alive = _src_alive(m, obs)
    ck = _verified(obs.src_checkpoint)
    fresh = ck if ck is not None and ck.created_at_s >= m.started_s else None
    if fresh is not None and not alive:
        moved = replace(m, src_checkpoint_uri=fresh.uri, checkpoint_step=fresh.step)
        nxt = _to(moved, _P.COPYING, now_s)
        return nxt, [_copy(nxt)]
    if _timed_out(m, now_s, limits):
        if not alive and ck is not None:
            why = (
                f"source stopped without a new checkpoint in {limits.checkpoint_timeout_s:g} s; "
                f"moving the verified one at step {ck.step}"
            )
            nxt = _to(
                replace(m, src_checkpoint_uri=ck.uri, checkpoint_step=ck.step, error=why),
                _P.COPYING,
                now_s,
            )
            return nxt, [_copy(nxt)]
        return _roll_back(
            m,
            obs,
            now_s,
            f"the job did not checkpoint and stop within {limits.checkpoint_timeout_s:g} s",
        )
    if fresh is not None:  # checkpointed but still running: stop it after the grace period
        if now_s - fresh.created_at_s >= limits.stop_grace_s:
            step = f"stop-source/{m.src_instance_id}"
            return m, [Terminate(m.src_instance_id, m.request_id(step))]
        return m, []
    if alive:
        return m, [RequestCheckpoint(m.src_instance_id, m.request_id("checkpoint"))]
    return m, []  # it died: a final checkpoint may still show up before the timeout


def _copying(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    if obs.job_finished:
        return _to(replace(m, error=_FINISHED), _P.FAILED, now_s), []
    copy = _verified(obs.dst_checkpoint)
    if copy is not None and copy.step == m.checkpoint_step:
        nxt = _to(replace(m, dst_checkpoint_uri=copy.uri), _P.PROVISIONING, now_s)
        return nxt, [_launch_dst(nxt)]
    if obs.copy_error is not None:
        why = f"copy to {m.dst_offer_id} failed: {obs.copy_error}"
    elif _timed_out(m, now_s, limits):
        why = f"copy to {m.dst_offer_id} did not verify within {limits.copy_timeout_s:g} s"
    else:
        return m, [_copy(m)]
    if _can_retry(m, limits):
        nxt = _retry(replace(m, error=why), now_s)
        return nxt, [_copy(nxt)]
    return _roll_back(m, obs, now_s, _last_try(why, m, limits))


def _provisioning(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    if obs.dst_instance_id and (obs.dst_state in _LIVE or _ran_from(m, obs.dst_checkpoint)):
        return _to(replace(m, dst_instance_id=obs.dst_instance_id), _P.RESTORING, now_s), []
    if obs.dst_state in _GONE:
        return _roll_back(m, obs, now_s, f"destination instance {obs.dst_state} before it booted")
    if obs.launch_error is not None:
        why = f"launch at {m.dst_offer_id} refused: {obs.launch_error}"
        if obs.launch_error is FailureKind.TRANSIENT and _can_retry(m, limits):
            nxt = _retry(replace(m, error=why), now_s)
            return nxt, [_launch_dst(nxt)]
        if obs.launch_error is FailureKind.TRANSIENT:
            why = _last_try(why, m, limits)
        return _roll_back(m, obs, now_s, why)
    if _timed_out(m, now_s, limits):
        return _roll_back(
            m,
            obs,
            now_s,
            f"no instance booting at {m.dst_offer_id} within {limits.provision_timeout_s:g} s",
        )
    return m, [_launch_dst(m)]


def _restoring(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    if (obs.dst_progress_after_restore and obs.dst_state in _LIVE) or _ran_from(
        m, obs.dst_checkpoint
    ):
        return _to(m, _P.RUNNING, now_s), []
    if obs.dst_state in _GONE:
        return _roll_back(m, obs, now_s, f"destination instance {obs.dst_state} while restoring")
    if _timed_out(m, now_s, limits):
        why = f"no progress after restore within {limits.restore_timeout_s:g} s"
        return _roll_back(m, obs, now_s, why)
    return m, []


def _running(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    return _to(m, _P.DONE, now_s), []


def _terminal(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    return m, []


def _roll_back(m: Migration, obs: Observation, now_s: float, why: str) -> Result:
    """Enter ROLLING_BACK and ask for what it needs at once. The observation's launch error,
    if any, is about the destination's launch and is not read here."""
    nxt = _to(replace(m, error=why), _P.ROLLING_BACK, now_s)
    nxt, actions = _stop_destination(nxt, obs)
    nxt = _decide_relaunch(nxt, obs, entering=True)
    if not nxt.src_instance_id:
        actions.append(_launch_src(nxt))
    return nxt, actions


def _rolling_back(m: Migration, obs: Observation, now_s: float, limits: Limits) -> Result:
    decided_before = not m.src_instance_id
    m, actions = _stop_destination(m, obs)
    m = _decide_relaunch(m, obs, entering=False)
    safe_on = m.src_instance_id  # the original instance, still alive
    if not safe_on and not decided_before:
        # The original instance stopped just now (it had been asked to): relaunch. Nothing
        # in this observation can be about that launch yet.
        actions.append(_launch_src(m))
    elif not safe_on:
        state = obs.rollback_state
        if obs.rollback_instance_id and (obs.job_finished or _ran_from(m, obs.src_checkpoint)):
            # The rollback instance restored and ran (it may have finished, or ended since,
            # before this controller saw it running): the job is safe, and what became of
            # that instance is the loop's, as after RUNNING. Relaunching would start it twice.
            safe_on = obs.rollback_instance_id
        elif state in _GONE or (obs.launch_error is not None and state not in _LIVE):
            why = (
                f"rollback launch at {m.src_offer_id} refused: {obs.launch_error}"
                if obs.launch_error is not None
                else f"rollback instance {state}"
            )
            if obs.launch_error not in _PERMANENT and _can_retry(m, limits):
                nxt = _retry(replace(m, error=f"{m.error}; {why}"), now_s)
                return nxt, [*actions, _launch_src(nxt)]
            kept = m.src_checkpoint_uri or "none was ever verified"
            why = (
                f"{m.error}; {_last_try(why, m, limits)}; the job holds no instance "
                f"(checkpoint kept: {kept})"
            )
            return _to(replace(m, error=why), _P.FAILED, now_s), actions
        elif state is None:
            actions.append(_launch_src(m))  # until the instance shows up
        elif state is InstanceState.RUNNING and obs.rollback_instance_id:
            safe_on = obs.rollback_instance_id
    dst_live = obs.dst_state in _LIVE
    if safe_on and not dst_live:
        return _to(replace(m, src_instance_id=safe_on), _P.FAILED, now_s), actions
    if _timed_out(m, now_s, limits):
        # Give up, asking for nothing new; a rollback instance still booting stays the job's.
        holder = safe_on or (obs.rollback_instance_id if obs.rollback_state in _LIVE else "")
        left = []
        if dst_live:
            left.append(f"destination instance {obs.dst_instance_id or '(id unknown)'} still alive")
        if not holder:
            left.append(
                f"rollback instance not seen ({m.request_id('rollback')}); "
                "the job holds no instance"
            )
        elif not safe_on:
            left.append(f"rollback instance {holder} still booting")
        timeout = f"rollback timed out after {limits.rollback_timeout_s:g} s"
        why = f"{m.error}; {timeout}: {', '.join(left)}"
        stops: list[MigrationAction] = [a for a in actions if isinstance(a, Terminate)]
        return _to(replace(m, src_instance_id=holder, error=why), _P.FAILED, now_s), stops
    return m, actions


_STEPS: Mapping[MigrationPhase, Step] = MappingProxyType(
    {
        _P.PLANNED: _planned,
        _P.CHECKPOINTING: _checkpointing,
        _P.COPYING: _copying,
        _P.PROVISIONING: _provisioning,
        _P.RESTORING: _restoring,
        _P.RUNNING: _running,
        _P.ROLLING_BACK: _rolling_back,
        _P.DONE: _terminal,
        _P.FAILED: _terminal,
    }
)


# --- helpers -----------------------------------------------------------------------------


def _to(m: Migration, phase: MigrationPhase, now_s: float) -> Migration:
    if phase not in TRANSITIONS[m.phase]:
        raise MigrationError(f"migration {m.id}: {m.phase} -> {phase} is not in TRANSITIONS")
    return replace(m, phase=phase, attempt=0, updated_s=now_s)


def _retry(m: Migration, now_s: float) -> Migration:
    return replace(m, attempt=m.attempt + 1, updated_s=now_s)


def _can_retry(m: Migration, limits: Limits) -> bool:
    return m.attempt + 1 < limits.max_attempts


def _last_try(why: str, m: Migration, limits: Limits) -> str:
    return f"{why} (attempt {m.attempt + 1} of {limits.max_attempts})"


def _timed_out(m: Migration, now_s: float, limits: Limits) -> bool:
    return now_s - m.updated_s >= limits.timeout_s(m.phase)


def _src_alive(m: Migration, obs: Observation) -> bool:
    return bool(m.src_instance_id) and obs.src_instance_alive


def _verified(ck: CheckpointSeen | None) -> CheckpointSeen | None:
    return ck if ck is not None and ck.verified else None


def _ran_from(m: Migration, seen: CheckpointSeen | None) -> bool:
    """An instance restored from the migration's checkpoint made progress: the store it
    writes to (`seen`, the newest there) holds a verified checkpoint newer than
    `checkpoint_step`, which only that instance can have written (one instance per job).
    At the destination the step is the one moved; at the source, for a rollback's
    relaunch, the one it restores, fixed once the original instance is gone
    (`_decide_relaunch`)."""
    ck = _verified(seen)
    return ck is not None and m.checkpoint_step >= 0 and ck.step > m.checkpoint_step


def _copy(m: Migration) -> CopyCheckpoint:
    return CopyCheckpoint(m.src_checkpoint_uri, m.dst_offer_id, m.request_id("copy"))


def _launch_dst(m: Migration) -> Launch:
    return Launch(m.dst_offer_id, m.dst_checkpoint_uri, m.request_id("launch"))


def _launch_src(m: Migration) -> Launch:
    return Launch(m.src_offer_id, m.src_checkpoint_uri, m.request_id("rollback"))


def _stop_destination(m: Migration, obs: Observation) -> Result:
    """Terminate the destination instance while it is seen alive (and remember its id)."""
    if obs.dst_state in _LIVE and obs.dst_instance_id:
        m = replace(m, dst_instance_id=obs.dst_instance_id)
        return m, [Terminate(obs.dst_instance_id, m.request_id(f"terminate/{obs.dst_instance_id}"))]
    return m, []


def _decide_relaunch(m: Migration, obs: Observation, *, entering: bool) -> Migration:
    """Decide, once, that the job needs a new instance at the source: its original instance
    is gone (or there was none). The checkpoint it restores is fixed at that moment — the
    newest verified one — so the rollback Launch is the same request on every tick."""
    if _src_alive(m, obs):
        return m
    if not m.src_instance_id and not entering:
        return m  # decided already
    ck = _verified(obs.src_checkpoint)
    if ck is not None and ck.step >= m.checkpoint_step:
        m = replace(m, src_checkpoint_uri=ck.uri, checkpoint_step=ck.step)
    return replace(m, src_instance_id="")
