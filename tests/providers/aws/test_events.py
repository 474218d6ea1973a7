"""poll_events: spot request status codes and instances that went away, as events, once.

moto neither reclaims spot capacity nor changes spot request status codes, so the status
comes from a `DescribeSpotInstanceRequests` answer in the shape EC2 returns, naming the
instances the adapter launched in moto.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from orchestrator.model import Market, Offer
from providers.aws import TAG_CLUSTER, TAG_JOB, TAG_REQUEST, AwsProvider
from providers.base import EventType, LaunchSpec

from .conftest import CLUSTER, T0, AwsError, Hooks, Raw

SPOT = Offer.make_id("aws", "us-east-1a", "p3.2xlarge", Market.SPOT)


def launch(provider: AwsProvider, request_id: str = "req-1", count: int = 1) -> str:
    outcome = provider.launch(
        LaunchSpec(
            job_id="job-1", offer_id=SPOT, cluster=CLUSTER, count=count, entrypoint=("train",)
        ),
        request_id=request_id,
    )
    assert outcome.ok
    return outcome.instance_id or ""


def spot_request(
    code: str,
    *,
    instance_id: str | None,
    request_id: str = "req-1",
    cluster: str = CLUSTER,
    sir: str = "sir-0123abcd",
) -> dict[str, Any]:
    """One SpotInstanceRequests entry, as EC2 describes a request made by RunInstances."""
    entry: dict[str, Any] = {
        "SpotInstanceRequestId": sir,
        "SpotPrice": "3.060000",
        "Type": "one-time",
        "State": "active" if code.startswith("marked") or code == "fulfilled" else "closed",
        "Status": {
            "Code": code,
            "UpdateTime": T0 + timedelta(minutes=5),
            "Message": f"status {code}",
        },
        "InstanceInterruptionBehavior": "terminate",
        "LaunchedAvailabilityZone": "us-east-1a",
        "ProductDescription": "Linux/UNIX",
        "CreateTime": T0,
        "Tags": [
            {"Key": TAG_CLUSTER, "Value": cluster},
            {"Key": TAG_JOB, "Value": "job-1"},
            {"Key": TAG_REQUEST, "Value": request_id},
        ],
    }
    if instance_id is not None:
        entry["InstanceId"] = instance_id
    return entry


def answer_spot(hooks: Hooks, *entries: dict[str, Any]) -> None:
    def handler(params: dict[str, Any]) -> dict[str, Any]:
        return {"SpotInstanceRequests": list(entries)}

    hooks.on("ec2:DescribeSpotInstanceRequests", handler)


def kinds(events: list[Any]) -> list[EventType]:
    return [e.type for e in events]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("marked-for-termination", [EventType.PREEMPTION_NOTICE]),
        ("marked-for-stop", [EventType.PREEMPTION_NOTICE]),
        ("instance-terminated-by-price", [EventType.PREEMPTED]),
        ("instance-terminated-by-service", [EventType.PREEMPTED]),
        ("instance-terminated-no-capacity", [EventType.PREEMPTED]),
        ("instance-terminated-capacity-oversubscribed", [EventType.PREEMPTED]),
        ("capacity-not-available", [EventType.CAPACITY_UNAVAILABLE]),
        ("fulfilled", []),
        ("pending-fulfillment", []),
        ("instance-terminated-by-user", []),
    ],
)
def test_spot_status_codes(
    provider: AwsProvider, hooks: Hooks, code: str, expected: list[EventType]
) -> None:
    instance_id = launch(provider)
    answer_spot(hooks, spot_request(code, instance_id=instance_id))

    events = provider.poll_events()

    assert kinds(events) == expected
    for event in events:
        assert (event.instance_id, event.job_id) == (instance_id, "job-1")
        assert code in event.detail
        assert event.time_s == T0.timestamp()


def test_notice_then_preemption_each_reported_once(
    provider: AwsProvider, hooks: Hooks, raw: Raw
) -> None:
    instance_id = launch(provider)
    answer_spot(hooks, spot_request("fulfilled", instance_id=instance_id))
    assert provider.poll_events() == []

    answer_spot(hooks, spot_request("marked-for-termination", instance_id=instance_id))
    assert kinds(provider.poll_events()) == [EventType.PREEMPTION_NOTICE]
    assert provider.poll_events() == []

    # AWS takes it: the request says so and the instance is gone; one PREEMPTED, not two.
    raw.terminate(instance_id)
    answer_spot(hooks, spot_request("instance-terminated-by-price", instance_id=instance_id))
    events = provider.poll_events()
    assert kinds(events) == [EventType.PREEMPTED]
    assert events[0].instance_id == instance_id
    assert provider.poll_events() == []


def test_capacity_loss_without_an_instance(provider: AwsProvider, hooks: Hooks) -> None:
    answer_spot(
        hooks,
        spot_request(
            "capacity-not-available", instance_id=None, request_id="req-9", sir="sir-nocap"
        ),
    )
    events = provider.poll_events()
    assert [(e.type, e.instance_id, e.job_id) for e in events] == [
        (EventType.CAPACITY_UNAVAILABLE, "sir-nocap", "job-1")
    ]
    assert provider.poll_events() == []


def test_spot_requests_of_another_cluster_are_ignored(provider: AwsProvider, hooks: Hooks) -> None:
    # The tag filter is sent (see test_ownership), and the answer is checked again.
    answer_spot(
        hooks, spot_request("marked-for-termination", instance_id="i-0abc", cluster="other")
    )
    assert provider.poll_events() == []


def test_instance_terminated_outside_heliotrope_is_a_preemption(
    provider: AwsProvider, raw: Raw
) -> None:
    instance_id = launch(provider)
    raw.terminate(instance_id)  # a person, or AWS

    events = provider.poll_events()

    assert [(e.type, e.instance_id, e.job_id) for e in events] == [
        (EventType.PREEMPTED, instance_id, "job-1")
    ]
    assert "not by Heliotrope" in events[0].detail
    assert provider.poll_events() == []


def test_instances_we_terminate_are_not_preemptions(provider: AwsProvider, hooks: Hooks) -> None:
    instance_id = launch(provider)
    provider.terminate([instance_id], request_id="stop-1")
    answer_spot(hooks, spot_request("instance-terminated-by-user", instance_id=instance_id))
    assert provider.poll_events() == []


def test_a_gang_member_lost_preempts_the_gang_by_its_leader(
    provider: AwsProvider, raw: Raw
) -> None:
    leader = launch(provider, count=2)
    ec2 = raw.client("ec2")
    members = [
        i["InstanceId"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
    ]
    (follower,) = [m for m in members if m != leader]
    raw.terminate(follower)

    events = provider.poll_events()

    assert [(e.type, e.instance_id) for e in events] == [(EventType.PREEMPTED, leader)]
    assert follower in events[0].detail


def test_a_failed_poll_loses_no_event(provider: AwsProvider, hooks: Hooks, raw: Raw) -> None:
    from orchestrator.errors import TransientError

    instance_id = launch(provider)
    raw.terminate(instance_id)
    hooks.on(
        "ec2:DescribeInstances",
        lambda params: (
            AwsError("RequestLimitExceeded") if (params["_region"] == "us-west-2") else None
        ),
    )
    with pytest.raises(TransientError):
        provider.poll_events()

    hooks.on("ec2:DescribeInstances", lambda params: None)
    assert [(e.type, e.instance_id) for e in provider.poll_events()] == [
        (EventType.PREEMPTED, instance_id)
    ]


def test_poll_fails_loudly_without_permission(provider: AwsProvider, hooks: Hooks) -> None:
    from orchestrator.errors import PermanentError

    hooks.on(
        "ec2:DescribeSpotInstanceRequests",
        lambda params: AwsError("UnauthorizedOperation", status=403),
    )
    with pytest.raises(PermanentError, match="DescribeSpotInstanceRequests"):
        provider.poll_events()
