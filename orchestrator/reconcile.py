"""Reconcile the fleet with what the provider runs: pure, events out.

Each live tick lists the cluster's instances (`ComputeProvider.list_instances`) and
compares them with the instance each job holds:

- a job whose instance is no longer listed (deleted behind the controller's back, a spot
  reclaim whose notice was missed, a machine that vanished) was preempted: a `PREEMPTED`
  event, handled like any other preemption (the job relaunches from its checkpoint);
- an instance listed in a terminal state (terminated, preempted) counts as gone too;
- everything else is left alone: instances of jobs the controller does not know, and
  instances of jobs that hold none (a launch the controller has not recorded yet is adopted
  by the write-ahead launch records, not here). Nothing is ever terminated from here.

Jobs in `skip` are left out: those being migrated (the migration machine owns their
instances) and those launched moments ago (a cloud may not list a new instance yet).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from orchestrator.model import InstanceId, JobSpec
from providers.base import EventType, InstanceInfo, InstanceState, ProviderEvent

GONE_STATES = frozenset({InstanceState.TERMINATED, InstanceState.PREEMPTED})


def reconcile(
    jobs: Sequence[JobSpec],
    instance_of: Sequence[InstanceId | None],
    listed: Mapping[InstanceId, InstanceInfo],
    now_s: float,
    *,
    skip: Collection[int] = (),
) -> list[ProviderEvent]:
    """Preemptions for jobs whose instance the provider no longer runs."""
    out: list[ProviderEvent] = []
    for j, instance in enumerate(instance_of):
        if instance is None or j in skip:
            continue
        info = listed.get(instance)
        if info is not None and info.state not in GONE_STATES:
            continue
        why = "not listed by the provider" if info is None else f"listed as {info.state.value}"
        out.append(
            ProviderEvent(
                EventType.PREEMPTED,
                instance,
                jobs[j].id,
                now_s,
                f"reconcile: instance {instance} {why}",
            )
        )
    return out
