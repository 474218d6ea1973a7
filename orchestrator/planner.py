"""Turn a policy's decision into actions, against the actual fleet. Pure.

The planner is where feasibility is enforced, so policies may be optimistic: an intent for
an offer the job may not use, that has no price now, or whose spot capacity is already
taken (by the fleet or by an earlier launch in this same plan) is refused with a reason.
Finished jobs always release their instance. A move is terminate-then-launch; the
executor checkpoints before it terminates.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import numpy as np

from orchestrator import units
from orchestrator.costs import move_cost
from orchestrator.model import Action, ActionKind, Decision, Phase
from policies.base import Snapshot

# Read per intent: plain ints and members bound once (enum attribute lookups are slow on 3.11).
_PENDING = int(Phase.PENDING)
_DONE = int(Phase.DONE)
_LAUNCH = ActionKind.LAUNCH
_TERMINATE = ActionKind.TERMINATE


def plan(
    snapshot: Snapshot,
    decision: Decision,
    tick: int,
    *,
    busy: Collection[int] = (),
    held: Mapping[int, str] | None = None,
) -> tuple[list[Action], list[tuple[int, str]]]:
    """Return (actions, refusals). Refusals are (job index, reason). Jobs in `busy` are being
    migrated: intents for them are refused until the migration ends. Jobs in `held` (job
    index -> why) keep what they have: a person's hold, a backoff after failed starts."""
    held = held or {}
    fleet = snapshot.fleet
    actions: list[Action] = []
    refused: list[tuple[int, str]] = []
    for j in ((fleet.phase == _DONE) & (fleet.offer >= 0)).nonzero()[0].tolist():
        actions.append(_act(_TERMINATE, snapshot, j, int(fleet.offer[j]), tick, "finished"))
    intents = decision.intents
    if not intents:
        return actions, refused
    # Per-job and per-offer numbers as Python lists: the loop below reads them per intent.
    phases: list[int] = fleet.phase.tolist()
    offers: list[int] = fleet.offer.tolist()
    free: list[float] = snapshot.spot_capacity.tolist()
    priced: list[bool] = (~np.isnan(snapshot.usd_per_hour)).tolist()
    fit = snapshot.fit
    n_offers = len(snapshot.offers)
    for j in sorted(intents):
        intent = intents[j]
        current = offers[j]
        blocked = _blocked(j, phases[j], busy, held)
        if blocked is not None:
            refused.append((j, blocked))
            continue
        if intent.offer == current:
            continue
        if intent.offer is None:
            if current < 0:
                continue
            actions.append(_act(_TERMINATE, snapshot, j, current, tick, f"pause: {intent.reason}"))
            continue
        o = intent.offer
        if not 0 <= o < n_offers:
            refused.append((j, f"offer index {o} out of range"))
            continue
        need = int(fit.instances[j, o])
        why = _unusable(snapshot, j, current, o, priced[o], free[o] >= need)
        if why is not None:
            refused.append((j, why))
        else:
            free[o] -= need
            if current >= 0:
                actions.append(
                    _act(_TERMINATE, snapshot, j, current, tick, f"move: {intent.reason}")
                )
            actions.append(_act(_LAUNCH, snapshot, j, o, tick, intent.reason))
    return actions, refused


def _blocked(j: int, phase: int, busy: Collection[int], held: Mapping[int, str]) -> str | None:
    """Why job `j` takes no new placement now: a move in progress, a hold, or its phase."""
    if j in busy:
        return "a migration is in progress"
    if j in held:
        return held[j]
    if phase in (_PENDING, _DONE):
        return f"job is {Phase(phase).name.lower()}"
    return None


def _unusable(
    snapshot: Snapshot, j: int, current: int, o: int, priced: bool, room: bool
) -> str | None:
    """Why job `j` may not go to offer `o` now (`priced`: it has a price now; `room`: its
    spot capacity has a slot)."""
    if snapshot.fit.rate[j, o] <= 0:
        return f"{snapshot.offers[o].gpu_type} not allowed for this job"
    if not priced:
        return f"{snapshot.offers[o].id} has no price now"
    if not room:
        return f"no spot capacity left at {snapshot.offers[o].id}"
    return _late_move(snapshot, j, current, o)


def _late_move(snapshot: Snapshot, j: int, current: int, o: int) -> str | None:
    """Why a move of job `j` from `current` to `o` is refused: it would finish after the
    deadline (a new cold start, the checkpoint's transfer, the work left at `o`'s speed)
    while staying would not. None when it is no move, or not late."""
    if current < 0:
        return None
    fit, fleet, job = snapshot.fit, snapshot.fleet, snapshot.jobs[j]
    remaining = max(0.0, job.work_gpu_hours - float(fleet.progress_gpu_h[j]))
    rate_dst, rate_here = float(fit.rate[j, o]), float(fit.rate[j, current])
    if rate_dst <= 0 or rate_here <= 0:
        return None
    src, dst = snapshot.offers[current], snapshot.offers[o]
    move = move_cost(job, src.location, dst.location, snapshot.settings)
    now_s = snapshot.now_s
    ready_s = float(fleet.ready_at_s[j])
    here_s = (now_s if math.isnan(ready_s) else max(now_s, ready_s)) + units.seconds(
        remaining / rate_here
    )
    there_s = now_s + units.seconds(job.cold_start_h + move.transfer_h + remaining / rate_dst)
    deadline_s = job.deadline.timestamp()
    if there_s > deadline_s >= here_s:
        late_h = units.hours(there_s - deadline_s)
        return (
            f"a move to {dst.id} would finish {late_h:.1f} h after the deadline (staying "
            f"finishes in time): held where it is"
        )
    return None


def _act(
    kind: ActionKind, snapshot: Snapshot, j: int, offer: int, tick: int, reason: str
) -> Action:
    return Action(kind, j, offer, request_id(snapshot, j, kind), reason)


def request_id(snapshot: Snapshot, j: int, kind: ActionKind) -> str:
    """The idempotency key of a launch or terminate: the job and its persisted launch count
    (the n-th launch is ``JOB:launch:n``), never the tick. A controller killed after the
    provider call and before its commit asks again with the same key after a restart, in
    whatever tick, and gets the instance it made instead of a second one; two launches of
    one job in one tick (a move, then another) get two keys."""
    n = int(snapshot.fleet.launches[j])
    job = snapshot.jobs[j].id
    if kind is _LAUNCH:
        return f"{job}:launch:{n + 1}"
    return f"{job}:{kind.value}:{n}"
