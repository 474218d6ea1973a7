"""poll_events(): `compute.instances.preempted` operations become PREEMPTED events, once."""

from __future__ import annotations

from datetime import datetime

import pytest

from orchestrator.errors import PermanentError, TransientError
from providers.base import EventType

from .conftest import CLUSTER, PROJECT, ZONE, ZONES, Factory, put_foreign_instances, spec
from .fake_compute import FakeCompute, recorded

PREEMPTED_AT = "2024-05-01T11:30:00.000-07:00"


def test_a_preemption_is_reported_once(make_provider: Factory, compute: FakeCompute) -> None:
    provider = make_provider()
    instance = provider.launch(spec(job="job-1"), request_id="req-1").instance_id or ""
    assert provider.poll_events() == []

    compute.preempt(ZONE, instance.split("/")[1], time=PREEMPTED_AT)
    [event] = provider.poll_events()

    assert (event.type, event.instance_id, event.job_id) == (EventType.PREEMPTED, instance, "job-1")
    assert event.time_s == datetime.fromisoformat(PREEMPTED_AT).timestamp()
    assert "Instance was preempted." in event.detail
    assert provider.poll_events() == []
    lists = compute.requests_for("compute.zoneOperations.list")
    assert {c.path.split("/")[-2] for c in lists} == set(ZONES)
    assert all(
        c.query["filter"] == ['operationType = "compute.instances.preempted"'] for c in lists
    )


def test_preemptions_of_instances_that_are_not_ours_are_ignored(
    make_provider: Factory, compute: FakeCompute
) -> None:
    foreign = put_foreign_instances(compute)
    provider = make_provider()
    provider.launch(spec(), request_id="req-1")
    for instance_id in foreign.values():
        compute.preempt(*instance_id.split("/"))
    assert provider.poll_events() == []


def test_a_gang_is_preempted_once_even_when_several_members_go(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    gang = provider.launch(spec(count=3), request_id="req-1").instance_id or ""
    name = gang.split("/")[1]
    compute.preempt(ZONE, f"{name}-0", time="2024-05-01T11:30:00.000-07:00")
    compute.preempt(ZONE, f"{name}-2", time="2024-05-01T11:30:05.000-07:00")
    events = provider.poll_events()
    assert [(e.type, e.instance_id) for e in events] == [(EventType.PREEMPTED, gang)]
    assert provider.poll_events() == []


def test_a_restarted_controller_learns_its_instances_from_labels(
    make_provider: Factory, compute: FakeCompute
) -> None:
    instance = make_provider().launch(spec(job="job-9"), request_id="req-1").instance_id or ""
    restarted = make_provider()
    assert restarted.poll_events() == []
    compute.preempt(ZONE, instance.split("/")[1], delete=False)  # still STOPPING
    [event] = restarted.poll_events()
    assert (event.instance_id, event.job_id) == (instance, "job-9")
    assert restarted.poll_events() == []


def test_what_we_terminate_is_not_a_preemption(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    instance = provider.launch(spec(), request_id="req-1").instance_id or ""
    provider.terminate([instance], request_id="stop-1")
    compute.preempt(ZONE, instance.split("/")[1])  # a preemption racing our delete
    assert provider.poll_events() == []
    assert provider.list_instances(cluster=CLUSTER) == {}


def test_compute_engine_failures_are_raised_as_heliotrope_errors(
    make_provider: Factory, compute: FakeCompute, sleeps: list[float]
) -> None:
    denied = recorded("error_403_permission_denied.json", project=PROJECT, zone=ZONE, instance="x")
    compute.script("compute.instances.aggregatedList", (403, denied))
    with pytest.raises(PermanentError, match="auth"):
        make_provider().poll_events()
    assert sleeps == []
    compute.script("compute.zoneOperations.list", (403, denied))
    with pytest.raises(PermanentError, match="auth"):
        make_provider().poll_events()
    compute.script(
        "compute.instances.aggregatedList", *[(503, recorded("error_503_backend.json"))] * 5
    )
    with pytest.raises(TransientError):
        make_provider().list_instances(cluster=CLUSTER)
    assert len(sleeps) == 4


def test_a_failed_delete_is_raised_after_trying_the_rest(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    first = provider.launch(spec(), request_id="req-1").instance_id or ""
    second = provider.launch(spec(), request_id="req-2").instance_id or ""
    denied = recorded("error_403_permission_denied.json", project=PROJECT, zone=ZONE, instance="x")
    compute.script("compute.instances.delete", (403, denied))
    with pytest.raises(PermanentError):
        provider.terminate([first, second], request_id="stop-1")
    assert set(compute.instances) == {(ZONE, first.split("/")[1])}
