"""Only our VMs are listed and deleted; everything else in the resource group is invisible."""

from __future__ import annotations

import pytest

from orchestrator.errors import PermanentError, TransientError
from providers.base import InstanceState
from tests.providers.azure.fake_arm import FakeArm, recorded
from tests.providers.azure.support import CLUSTER, OD_A100, SPOT_A100, Factory, spec

DELETE = ("DELETE", "Microsoft.Compute/virtualMachines/delete")


def foreign_vms(arm: FakeArm, our_name: str) -> None:
    arm.add_vm("build-agent-7", tags={})  # someone's VM, no tags
    arm.add_vm(
        "hel-0123456789abcdef0123",
        tags={  # another cluster's Heliotrope VM
            "heliotrope-cluster": "other",
            "heliotrope-request": "r",
        },
    )
    arm.add_vm(
        "jupyter-gpu",
        tags={  # hand-tagged with our cluster, not a name we make
            "heliotrope-cluster": CLUSTER,
            "heliotrope-request": "r",
        },
    )
    arm.add_vm(f"{our_name}-g9-0", tags={"heliotrope-cluster": CLUSTER})  # no request tag


def test_list_shows_our_gangs_only_across_pages(make_provider: Factory, arm: FakeArm) -> None:
    provider = make_provider()
    spot = provider.launch(spec(), request_id="a").instance_id
    gang = provider.launch(spec(OD_A100, count=2, job="job-2"), request_id="b").instance_id
    assert spot is not None and gang is not None
    foreign_vms(arm, spot.split("/")[1])
    listed = provider.list_instances(cluster=CLUSTER)
    assert set(listed) == {spot, gang}
    assert listed[spot].state is InstanceState.RUNNING
    assert listed[spot].offer_id == SPOT_A100 and listed[spot].job_id == "job-1"
    assert listed[gang].offer_id == OD_A100 and listed[gang].job_id == "job-2"
    assert listed[spot].ready_at_s - listed[spot].launched_at_s == 600.0
    assert len(arm.vms) > 2  # more than one page (the fake pages by 2)
    assert provider.list_instances(cluster="other") == {}


def test_a_broken_gang_is_listed_as_gone(make_provider: Factory, arm: FakeArm) -> None:
    provider = make_provider()
    gang = provider.launch(spec(count=2), request_id="g").instance_id
    assert gang is not None
    arm.evict(f"{gang.split('/')[1]}-1")
    assert provider.list_instances(cluster=CLUSTER)[gang].state is InstanceState.PREEMPTED


def test_terminate_deletes_ours_and_nothing_else(make_provider: Factory, arm: FakeArm) -> None:
    provider = make_provider()
    ours = provider.launch(spec(count=2), request_id="a").instance_id
    assert ours is not None
    foreign_vms(arm, ours.split("/")[1])
    before = set(arm.vms)
    provider.terminate(
        [
            ours,
            "eastus/build-agent-7",
            "eastus/jupyter-gpu",
            "eastus/hel-0123456789abcdef0123",
            "westus/hel-0123456789abcdef0123",
            "not-an-id",
        ],
        request_id="stop",
    )
    deleted = {c.path.rsplit("/", 1)[1] for c in arm.requests_for(*DELETE)}
    gang = ours.split("/")[1]
    assert deleted == {f"{gang}-0", f"{gang}-1"}
    assert set(arm.vms) == before - deleted
    provider.terminate([ours], request_id="stop")  # already gone: nothing to do
    assert len(arm.requests_for(*DELETE)) == 2


def test_terminate_raises_after_trying_every_vm(make_provider: Factory, arm: FakeArm) -> None:
    provider = make_provider()
    a = provider.launch(spec(), request_id="a").instance_id
    b = provider.launch(spec(), request_id="b").instance_id
    assert a is not None and b is not None
    arm.script(
        *DELETE,
        (
            403,
            recorded(
                "error_authorization_failed.json", subscription="s", resource_group="rg", name="n"
            ),
        ),
    )
    with pytest.raises(PermanentError, match="AuthorizationFailed"):
        provider.terminate([a, b], request_id="stop")
    assert len(arm.requests_for(*DELETE)) == 2
    assert list(provider.list_instances(cluster=CLUSTER)) == [a]


def test_listing_errors_raise_transient_or_permanent(
    make_provider: Factory, arm: FakeArm, sleeps: list[float]
) -> None:
    arm.script(
        "GET",
        "Microsoft.Compute/virtualMachines/read",
        *[(503, {"error": {"code": "ServiceUnavailable", "message": "down"}})] * 2,
    )
    with pytest.raises(TransientError):
        make_provider(max_attempts=2).list_instances(cluster=CLUSTER)
    assert len(sleeps) == 1
    arm.script(
        "GET",
        "Microsoft.Compute/virtualMachines/read",
        (
            403,
            recorded(
                "error_authorization_failed.json", subscription="s", resource_group="rg", name="n"
            ),
        ),
    )
    with pytest.raises(PermanentError, match="auth"):
        make_provider().list_instances(cluster=CLUSTER)
