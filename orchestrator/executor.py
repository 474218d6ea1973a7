"""Carry out planned actions through a provider; report what happened as events.

Every call carries the action's request id, so re-running a tick after a crash buys
nothing twice. Provider failures come back as `REJECTED` events, never as exceptions.
A move checkpoints the job before its instance is terminated (recorded in the event), and
a launch in another region first pays for the checkpoint's transfer (egress and time).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from orchestrator.model import Action, ActionKind, Event, EventKind, InstanceId, Snapshot
from policies.costs import move_cost
from providers.base import ComputeProvider, LaunchSpec

logger = logging.getLogger(__name__)


def execute(
    actions: Sequence[Action],
    snapshot: Snapshot,
    provider: ComputeProvider,
    instance_of: Sequence[InstanceId | None],
    *,
    cluster: str,
) -> list[Event]:
    events: list[Event] = []
    now_s = snapshot.now_s
    fleet = snapshot.fleet
    for action in actions:
        job = snapshot.jobs[action.job]
        offer = snapshot.offers[action.offer]
        if action.kind is ActionKind.TERMINATE:
            instance = instance_of[action.job]
            if instance is not None:
                provider.terminate([instance], request_id=action.request_id)
            logger.info("terminate %s on %s: %s", job.id, offer.id, action.reason)
            events.append(Event(now_s, job.id, EventKind.TERMINATED, offer.id, action.reason))
            continue
        src_k = int(fleet.checkpoint_offer[action.job])
        src = snapshot.offers[src_k].location if src_k >= 0 else None
        move = move_cost(job, src, offer.location, snapshot.settings)
        startup_s = (job.cold_start_h + move.transfer_h) * 3600.0
        outcome = provider.launch(
            LaunchSpec(
                job_id=job.id,
                offer_id=offer.id,
                cluster=cluster,
                startup_s=startup_s,
                count=int(snapshot.fit.instances[action.job, action.offer]),
                env={"HELIOTROPE_JOB_ID": job.id},
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
        logger.info("launch %s on %s: %s", job.id, offer.id, action.reason)
        events.append(
            Event(
                now_s,
                job.id,
                EventKind.LAUNCHED,
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
