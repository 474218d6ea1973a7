"""Carry out planned actions through a provider; report what happened as events.

Every call carries the action's request id, so re-running a tick after a crash buys
nothing twice. Provider failures come back as `REJECTED` events, never as exceptions.

Moves. In replay a move is immediate: terminate (the job checkpoints first, so nothing is
lost), then launch at the destination, paying egress and the transfer time as part of the
new instance's cold start. Live, a move takes many ticks (checkpoint, copy, verify, launch,
restore), so when a `Mover` is given, every launch that needs the job's checkpoint moved —
the job runs elsewhere, or its checkpoint lies in another region — is handed to it instead,
with the terminate that preceded it; the mover drives the migration state machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from orchestrator import failpoints, units
from orchestrator.costs import move_cost
from orchestrator.model import (
    Action,
    ActionKind,
    Event,
    EventKind,
    InstanceId,
    JobSpec,
    Offer,
)
from policies.base import Snapshot
from providers.base import ComputeProvider, Launcher, LaunchSpec

logger = logging.getLogger(__name__)

# Members bound once: read per action (enum attribute lookups are slow on 3.11).
_LAUNCH = ActionKind.LAUNCH
_TERMINATE = ActionKind.TERMINATE
_LAUNCHED = EventKind.LAUNCHED
_TERMINATED = EventKind.TERMINATED

LaunchEnv = Callable[[JobSpec, Offer], Mapping[str, str]]


class Mover(Protocol):
    """Takes over launches that need a checkpoint moved (the live migration driver)."""

    def needs_move(self, snapshot: Snapshot, job: int, dst: int) -> bool: ...

    def begin(self, snapshot: Snapshot, job: int, dst: int, reason: str) -> list[Event]: ...


def execute(
    actions: Sequence[Action],
    snapshot: Snapshot,
    provider: ComputeProvider,
    instance_of: Sequence[InstanceId | None],
    *,
    cluster: str,
    mover: Mover | None = None,
    launch_env: LaunchEnv | None = None,
    entrypoint: Sequence[str] = (),
) -> list[Event]:
    events: list[Event] = []
    now_s = snapshot.now_s
    fleet = snapshot.fleet
    moved = (
        {a.job for a in actions if a.kind is _LAUNCH and mover.needs_move(snapshot, a.job, a.offer)}
        if mover is not None
        else set()
    )
    for action in actions:
        job = snapshot.jobs[action.job]
        offer = snapshot.offers[action.offer]
        if action.job in moved:
            if action.kind is _LAUNCH and mover is not None:
                events += mover.begin(snapshot, action.job, action.offer, action.reason)
            continue  # the mover stops the source instance itself, after its checkpoint
        if action.kind is _TERMINATE:
            instance = instance_of[action.job]
            if instance is not None:
                provider.terminate([instance], request_id=action.request_id)
            logger.info("terminate %s on %s: %s", job.id, offer.id, action.reason)
            events.append(Event(now_s, job.id, _TERMINATED, offer.id, action.reason))
            continue
        src_k = int(fleet.checkpoint_offer[action.job])
        src = snapshot.offers[src_k].location if src_k >= 0 else None
        move = move_cost(job, src, offer.location, snapshot.settings)
        startup_s = units.seconds(job.cold_start_h + move.transfer_h)
        env = {"HELIOTROPE_JOB_ID": job.id, **(launch_env(job, offer) if launch_env else {})}
        outcome = provider.launch(
            LaunchSpec(
                job_id=job.id,
                offer_id=offer.id,
                cluster=cluster,
                startup_s=startup_s,
                count=int(snapshot.fit.instances[action.job, action.offer]),
                entrypoint=tuple(job.command or entrypoint),
                env=env,
                launcher=Launcher(job.launcher),
            ),
            request_id=action.request_id,
        )
        if outcome.error is not None:
            logger.info(
                "launch of %s on %s refused (%s): %s",
                job.id,
                offer.id,
                outcome.error.kind.value,
                outcome.error.message,
            )
            events.append(
                Event(
                    now_s,
                    job.id,
                    EventKind.REJECTED,
                    offer.id,
                    f"{outcome.error.kind.value}: {outcome.error.message}",
                )
            )
            continue
        # Tests kill the process here: launched, nothing committed (orchestrator/failpoints.py).
        failpoints.hit("launch.after", job.id)
        logger.info("launch %s on %s: %s", job.id, offer.id, action.reason)
        events.append(
            Event(
                now_s,
                job.id,
                _LAUNCHED,
                offer.id,
                action.reason,
                {
                    "ready_at_s": outcome.ready_at_s,
                    "egress_usd": move.egress_usd,
                    "transfer_h": move.transfer_h,
                },
                instance_id=outcome.instance_id or "",
            )
        )
    return events
