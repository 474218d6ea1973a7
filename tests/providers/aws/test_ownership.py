"""Instances that are not ours do not exist for the adapter: it never lists, terminates or
reports them, whatever ids it is handed.

Each test first creates instances outside the adapter: one untagged, one tagged for another
cluster (with the same job and request tags as ours, to show the match is on the cluster),
then works with the adapter and checks moto's state and every call it sent.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator.model import Market, Offer
from providers.aws import TAG_CLUSTER, TAG_JOB, TAG_REQUEST, AwsProvider
from providers.base import LaunchSpec

from .conftest import CLUSTER, Hooks, Raw

OD = Offer.make_id("aws", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)


def spec(job: str = "job-1") -> LaunchSpec:
    return LaunchSpec(job_id=job, offer_id=OD, cluster=CLUSTER, entrypoint=("train",))


@pytest.fixture
def foreign(raw: Raw) -> dict[str, str]:
    """Instances that are not ours: untagged, another cluster's, a look-alike name."""
    return {
        "untagged": raw.run()[0],
        "other-cluster": raw.run(
            tags={TAG_CLUSTER: "other", TAG_JOB: "job-1", TAG_REQUEST: "req-1"}
        )[0],
        "prefix-cluster": raw.run(tags={TAG_CLUSTER: f"{CLUSTER}-2"})[0],
        "no-cluster-tag": raw.run(tags={TAG_JOB: "job-1", TAG_REQUEST: "req-1"})[0],
        "west-other": raw.run(tags={TAG_CLUSTER: "other"}, region="us-west-2", zone="us-west-2a")[
            0
        ],
    }


def test_list_sees_only_our_cluster(provider: AwsProvider, foreign: dict[str, str]) -> None:
    ours = provider.launch(spec(), request_id="req-1")
    assert ours.ok and ours.instance_id not in foreign.values()  # not the look-alike request

    listed = provider.list_instances(cluster=CLUSTER)

    assert list(listed) == [ours.instance_id]
    assert listed[ours.instance_id or ""].job_id == "job-1"


def test_terminate_touches_only_our_instances(
    provider: AwsProvider,
    foreign: dict[str, str],
    raw: Raw,
    hooks: Hooks,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""

    provider.terminate([*foreign.values(), ours, "i-00000000000000000"], request_id="stop-all")

    assert raw.state(ours) in ("shutting-down", "terminated")
    for name, instance_id in foreign.items():
        region = "us-west-2" if name.startswith("west") else "us-east-1"
        assert raw.state(instance_id, region) == "running", name
    terminated = [i for p in hooks.called("ec2:TerminateInstances") for i in p["InstanceIds"]]
    assert terminated == [ours]
    for instance_id in foreign.values():
        assert instance_id in caplog.text  # each skip is logged
    assert "skipped" in caplog.text


def test_a_provider_of_another_cluster_cannot_terminate_ours(
    provider: AwsProvider, make_provider: Callable[..., AwsProvider], raw: Raw, hooks: Hooks
) -> None:
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""
    intruder = make_provider(cluster="other")

    intruder.terminate([ours], request_id="stop-theirs")

    assert raw.state(ours) == "running"
    assert hooks.called("ec2:TerminateInstances") == []
    assert intruder.list_instances(cluster="other") == {}


def test_poll_never_reports_instances_that_are_not_ours(
    provider: AwsProvider, foreign: dict[str, str], raw: Raw
) -> None:
    provider.launch(spec(), request_id="req-1")
    raw.terminate(*[i for n, i in foreign.items() if not n.startswith("west")])
    raw.terminate(foreign["west-other"], region="us-west-2")

    assert provider.poll_events() == []


def test_every_instance_call_names_our_cluster(
    provider: AwsProvider, foreign: dict[str, str], hooks: Hooks
) -> None:
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""
    provider.list_instances(cluster=CLUSTER)
    provider.terminate([*foreign.values(), ours], request_id="stop")
    provider.poll_events()

    describes = hooks.called("ec2:DescribeInstances") + hooks.called(
        "ec2:DescribeSpotInstanceRequests"
    )
    assert describes
    for params in describes:
        assert {"Name": f"tag:{TAG_CLUSTER}", "Values": [CLUSTER]} in params["Filters"]
