"""list_instances() and terminate() see and touch only this cluster's instances.

Each test first puts instances that are not ours on the endpoint: one of another
Heliotrope cluster (named like ours), one without labels, and one someone labelled by hand
with our cluster label (but that Heliotrope never launched).
"""

from __future__ import annotations

import pytest

from providers.base import InstanceState
from providers.gcp import GcpProvider, naming

from .conftest import (
    CLUSTER,
    OD_A100,
    SPOT_A100,
    ZONE,
    ZONES,
    Factory,
    put_foreign_instances,
    spec,
)
from .fake_compute import FakeCompute

EU_ZONE = ZONES[1]
DELETE = "compute.instances.delete"


@pytest.mark.parametrize("honour_filters", [True, False])
def test_only_our_instances_are_listed(
    make_provider: Factory, compute: FakeCompute, honour_filters: bool
) -> None:
    """Even if Compute Engine ignored the label filter, the adapter checks ownership."""
    compute.honour_filters = honour_filters
    put_foreign_instances(compute)
    provider = make_provider()
    spot = provider.launch(spec(job="job-1"), request_id="req-1")
    od = provider.launch(spec(OD_A100, job="job-2", count=2), request_id="req-2")

    listed = make_provider().list_instances(cluster=CLUSTER)  # a fresh provider: no memory

    assert set(listed) == {spot.instance_id, od.instance_id}
    a = listed[spot.instance_id or ""]
    assert (a.offer_id, a.job_id, a.state) == (SPOT_A100, "job-1", InstanceState.RUNNING)
    assert a.ready_at_s == a.launched_at_s + 600.0
    b = listed[od.instance_id or ""]
    assert (b.offer_id, b.job_id, b.state) == (OD_A100, "job-2", InstanceState.RUNNING)
    [aggregated] = compute.requests_for("compute.instances.aggregatedList")
    assert aggregated.query["filter"] == ['labels.heliotrope-cluster = "ml-prod"']


def test_another_cluster_is_invisible(make_provider: Factory, compute: FakeCompute) -> None:
    put_foreign_instances(compute)
    assert make_provider().list_instances(cluster="other-team") == {}
    assert compute.calls == []


@pytest.mark.parametrize("honour_filters", [True, False])
def test_terminate_deletes_only_what_it_owns(
    make_provider: Factory, compute: FakeCompute, honour_filters: bool
) -> None:
    compute.honour_filters = honour_filters
    foreign = put_foreign_instances(compute)
    provider = make_provider()
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""

    provider.terminate([*foreign.values(), ours, "garbage", "us-central1-a/"], request_id="stop-1")

    deletes = compute.requests_for(DELETE)
    assert [c.path.rsplit("/", 1)[-1] for c in deletes] == [ours.split("/")[1]]
    assert deletes[0].query["requestId"][0] == naming.request_uuid(
        "stop-1", ZONE, ours.split("/")[1], "delete"
    )
    assert {f"{z}/{n}" for z, n in compute.instances} == set(foreign.values())
    # everything Heliotrope does afterwards still leaves them alone
    provider.list_instances(cluster=CLUSTER)
    provider.poll_events()
    provider.terminate(list(foreign.values()), request_id="stop-2")
    assert len(compute.requests_for(DELETE)) == 1
    assert {f"{z}/{n}" for z, n in compute.instances} == set(foreign.values())


def test_terminate_is_idempotent_and_deletes_whole_gangs(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    gang = provider.launch(spec(count=3), request_id="req-1").instance_id or ""
    provider.terminate([gang], request_id="stop-1")
    provider.terminate([gang], request_id="stop-1")
    assert len(compute.requests_for(DELETE)) == 3
    assert compute.instances == {}
    assert provider.list_instances(cluster=CLUSTER) == {}


def test_states_follow_what_compute_engine_says(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider: GcpProvider = make_provider()
    booting = provider.launch(spec(job="boot"), request_id="req-boot").instance_id or ""
    broken = provider.launch(spec(job="gang", count=2), request_id="req-gang").instance_id or ""
    stopping = provider.launch(spec(OD_A100, job="od"), request_id="req-od").instance_id or ""
    compute.instances[(ZONE, booting.split("/")[1])]["status"] = "STAGING"
    compute.instances.pop((ZONE, f"{broken.split('/')[1]}-1"))  # one member preempted
    compute.instances[(ZONE, stopping.split("/")[1])]["status"] = "TERMINATED"

    states = {k: v.state for k, v in provider.list_instances(cluster=CLUSTER).items()}

    assert states == {
        booting: InstanceState.BOOTING,
        broken: InstanceState.PREEMPTED,
        stopping: InstanceState.TERMINATED,
    }
