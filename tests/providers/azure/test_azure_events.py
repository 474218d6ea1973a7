"""Preemption: a Spot VM evicted with policy Delete disappears; poll_events says so once."""

from __future__ import annotations

from providers.base import EventType
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.support import CLUSTER, OD_A100, T0, Factory, spec


def test_an_evicted_spot_vm_is_reported_once_and_leaves_the_list(
    make_provider: Factory, arm: FakeArm
) -> None:
    provider = make_provider()
    spot = provider.launch(spec(), request_id="s").instance_id
    other = provider.launch(spec(job="job-2"), request_id="t").instance_id
    assert spot is not None and other is not None
    assert provider.poll_events() == []
    arm.evict(spot.split("/")[1])
    [event] = provider.poll_events()
    assert (event.type, event.instance_id, event.job_id) == (EventType.PREEMPTED, spot, "job-1")
    assert event.time_s == T0.timestamp() and "spot VM evicted" in event.detail
    assert provider.poll_events() == []
    assert list(provider.list_instances(cluster=CLUSTER)) == [other]


def test_a_vm_being_deleted_by_azure_is_preempted(make_provider: Factory, arm: FakeArm) -> None:
    provider = make_provider()
    gang = provider.launch(spec(count=2), request_id="g").instance_id
    assert gang is not None
    arm.set_state(f"{gang.split('/')[1]}-0", "Deleting")
    [event] = provider.poll_events()
    assert event.instance_id == gang and "deleting" in event.detail


def test_what_heliotrope_terminates_is_not_a_preemption(
    make_provider: Factory, arm: FakeArm
) -> None:
    provider = make_provider()
    vm = provider.launch(spec(), request_id="s").instance_id
    assert vm is not None
    provider.terminate([vm], request_id="stop")
    assert provider.poll_events() == []


def test_a_restarted_provider_learns_our_vms_and_reports_their_loss(
    make_provider: Factory, arm: FakeArm
) -> None:
    vm = make_provider().launch(spec(OD_A100), request_id="od").instance_id
    assert vm is not None
    arm.add_vm("build-agent-7", tags={})
    restarted = make_provider()
    assert restarted.poll_events() == []  # learns what is there
    arm.evict(vm.split("/")[1])
    arm.evict("build-agent-7")  # not ours: never reported
    [event] = restarted.poll_events()
    assert event.instance_id == vm and "deleted outside Heliotrope" in event.detail
