"""Listing, terminating and events: only our pods, preemption as eviction or DisruptionTarget."""

from __future__ import annotations

import pytest

from orchestrator.clock import FakeClock
from orchestrator.errors import PermanentError, TransientError
from providers.base import EventType, InstanceState
from tests.providers.kubernetes.fake_kube import FakeKube, recorded
from tests.providers.kubernetes.support import (
    A100X1,
    A100X8,
    CLUSTER,
    H100X8_SPOT,
    Factory,
    spec,
)


def foreign_pods(fake: FakeKube, our_name: str) -> None:
    fake.add_pod("notebook-0", labels={"app": "jupyter"}, annotations={})
    fake.add_pod(
        "hel-0123456789abcdef0123",  # another cluster's Heliotrope pod
        labels={"heliotrope-cluster": "other"},
        annotations={"heliotrope.io/cluster": "other"},
    )
    fake.add_pod(
        "trainer-x",  # labelled like ours by hand, not a name we make
        labels={"heliotrope-cluster": CLUSTER},
        annotations={"heliotrope.io/cluster": CLUSTER},
    )
    fake.add_pod(
        f"{our_name}-g9-0",  # our label, no exact cluster annotation
        labels={"heliotrope-cluster": CLUSTER},
        annotations={},
    )


def test_list_shows_our_gangs_in_every_context(
    make_provider: Factory, onprem: FakeKube, gpucloud: FakeKube
) -> None:
    provider = make_provider()
    a = provider.launch(spec(A100X1, count=2), request_id="a").instance_id
    h = provider.launch(spec(), request_id="h").instance_id
    assert a is not None and h is not None
    foreign_pods(onprem, a.split("/")[1])
    listed = provider.list_instances(cluster=CLUSTER)
    assert set(listed) == {a, h}
    assert listed[a].offer_id == A100X1 and listed[h].offer_id == H100X8_SPOT
    assert listed[a].state is InstanceState.RUNNING
    assert listed[h].ready_at_s - listed[h].launched_at_s == 120.0
    assert provider.list_instances(cluster="other") == {}


def test_terminate_deletes_ours_with_the_grace_period_and_nothing_else(
    make_provider: Factory, onprem: FakeKube
) -> None:
    provider = make_provider()
    gang = provider.launch(spec(A100X1, count=2), request_id="a").instance_id
    assert gang is not None
    foreign_pods(onprem, gang.split("/")[1])
    before = set(onprem.pods)
    provider.terminate(
        [
            gang,
            "onprem/notebook-0",
            "onprem/trainer-x",
            "onprem/hel-0123456789abcdef0123",
            "elsewhere/hel-0123456789abcdef0123",
            "junk",
        ],
        request_id="stop",
    )
    deletes = onprem.requests_for("pods", "delete")
    name = gang.split("/")[1]
    assert {c.path.rsplit("/", 1)[1] for c in deletes} == {f"{name}-0", f"{name}-1"}
    assert all(c.query["gracePeriodSeconds"] == ["120"] for c in deletes)
    assert set(onprem.pods) == before - {f"{name}-0", f"{name}-1"}
    assert onprem.services == {}
    assert provider.poll_events() == []  # what we end is not a preemption


def test_an_api_eviction_is_a_notice_then_a_preemption(
    make_provider: Factory, gpucloud: FakeKube
) -> None:
    provider = make_provider()
    vm = provider.launch(spec(), request_id="s").instance_id
    assert vm is not None
    name = vm.split("/")[1]
    assert provider.poll_events() == []
    gpucloud.disrupt(name)  # kubectl drain / the eviction API: SIGTERM, grace period
    [notice] = provider.poll_events()
    assert notice.type is EventType.PREEMPTION_NOTICE and notice.instance_id == vm
    assert "EvictionByEvictionAPI" in notice.detail and "120 s" in notice.detail
    assert "Killing" in notice.detail  # the pod's event
    assert provider.poll_events() == []
    assert provider.list_instances(cluster=CLUSTER)[vm].state is InstanceState.PREEMPTED
    gpucloud.remove(name)  # the grace period is over
    [gone] = provider.poll_events()
    assert gone.type is EventType.PREEMPTED and gone.job_id == "job-1"
    assert provider.poll_events() == []
    assert provider.list_instances(cluster=CLUSTER) == {}


def test_scheduler_preemption_of_a_finished_pod_is_preempted(
    make_provider: Factory, gpucloud: FakeKube
) -> None:
    provider = make_provider()
    vm = provider.launch(spec(), request_id="s").instance_id
    assert vm is not None
    name = vm.split("/")[1]
    gpucloud.disrupt(name, "PreemptionByScheduler", "preempted by a higher priority pod")
    gpucloud.finish(name, 143)  # SIGTERM'd
    [event] = provider.poll_events()
    assert event.type is EventType.PREEMPTED and "PreemptionByScheduler" in event.detail


def test_a_kubelet_eviction_is_preempted(make_provider: Factory, onprem: FakeKube) -> None:
    provider = make_provider()
    gang = provider.launch(spec(A100X1, count=2), request_id="g").instance_id
    assert gang is not None
    onprem.kubelet_evict(f"{gang.split('/')[1]}-1")
    [event] = provider.poll_events()
    assert event.type is EventType.PREEMPTED and "evicted" in event.detail
    assert "The node was low on resource" in event.detail


def test_finished_pods_are_completed_or_failed(make_provider: Factory, onprem: FakeKube) -> None:
    provider = make_provider()
    done = provider.launch(spec(A100X1, count=2), request_id="d").instance_id
    bad = provider.launch(spec(A100X1, job="job-2"), request_id="b").instance_id
    assert done is not None and bad is not None
    onprem.finish(f"{done.split('/')[1]}-0", 0)
    assert provider.poll_events() == []  # one rank still running
    onprem.finish(f"{done.split('/')[1]}-1", 0)
    onprem.finish(bad.split("/")[1], 3)
    events = {e.instance_id: e for e in provider.poll_events()}
    assert events[done].type is EventType.COMPLETED
    assert events[bad].type is EventType.FAILED and "exit code 3" in events[bad].detail


def test_a_gang_that_stays_unschedulable_is_deleted_and_preempted(
    make_provider: Factory, onprem: FakeKube, clock: FakeClock
) -> None:
    # Another tenant holds a whole node: Heliotrope counts only its own pods, so the gang
    # looks like it fits; the scheduler leaves one pod Pending (Unschedulable).
    onprem.add_pod(
        "someone-elses-training",
        labels={"team": "vision"},
        annotations={},
        node="dgx-a100-02",
        gpus=8,
    )
    provider = make_provider()
    gang = provider.launch(spec(A100X8, count=2), request_id="fits").instance_id
    assert gang is not None
    assert provider.list_instances(cluster=CLUSTER)[gang].state is InstanceState.BOOTING
    assert provider.poll_events() == []
    clock.advance(200)
    assert provider.poll_events() == []
    clock.advance(101)
    [event] = provider.poll_events()
    assert event.type is EventType.PREEMPTED and "unschedulable for 301 s" in event.detail
    assert "FailedScheduling" in event.detail
    assert set(onprem.pods) == {"someone-elses-training"} and onprem.services == {}


def test_a_restarted_provider_learns_its_pods(make_provider: Factory, gpucloud: FakeKube) -> None:
    vm = make_provider().launch(spec(), request_id="s").instance_id
    assert vm is not None
    restarted = make_provider()
    assert restarted.poll_events() == []
    gpucloud.remove(vm.split("/")[1])
    [event] = restarted.poll_events()
    assert event.type is EventType.PREEMPTED and event.instance_id == vm


def test_listing_errors_raise(
    make_provider: Factory, onprem: FakeKube, sleeps: list[float]
) -> None:
    onprem.script("GET", "pods", "list", *[(503, recorded("status_429.json"))] * 2)
    with pytest.raises(TransientError):
        make_provider(max_attempts=2).list_instances(cluster=CLUSTER)
    onprem.script("GET", "pods", "list", (401, recorded("status_401.json")))
    with pytest.raises(PermanentError, match="auth"):
        make_provider().list_instances(cluster=CLUSTER)


def test_a_wrong_token_is_auth(make_provider: Factory, onprem: FakeKube) -> None:
    onprem.token = "rotated"
    out = make_provider().launch(spec(A100X8), request_id="t")
    assert out.error is not None and out.error.kind.value == "auth"
