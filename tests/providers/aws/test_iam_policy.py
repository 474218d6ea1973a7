"""Least privilege: infra/aws/iam-policy.json allows exactly the AWS actions the adapter
calls in this test suite, and nothing more.

The session factory of conftest.py records every (service, operation, parameter names) the
adapter sent, across all AWS tests; this module runs after them (conftest reorders it).
Operations map to IAM actions by the Service Authorization Reference; a few parameters need
one more action (tags given to RunInstances need ec2:CreateTags, an instance profile needs
iam:PassRole). The structural tests say which of those actions are fenced by the cluster
tag.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
POLICY = REPO / "infra" / "aws" / "iam-policy.json"

# Operations whose IAM action is not "<service>:<Operation>".
IAM_ACTION = {
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "PutBucketEncryption"): "s3:PutEncryptionConfiguration",
    ("s3", "GetBucketEncryption"): "s3:GetEncryptionConfiguration",
    ("s3", "PutPublicAccessBlock"): "s3:PutBucketPublicAccessBlock",
    ("s3", "GetPublicAccessBlock"): "s3:GetBucketPublicAccessBlock",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
}
# (service, operation, parameter) -> the extra action that parameter needs.
IMPLIED = {
    ("ec2", "RunInstances", "TagSpecifications"): "ec2:CreateTags",
    ("ec2", "RunInstances", "IamInstanceProfile"): "iam:PassRole",
}
CLUSTER_TAG = "heliotrope:cluster"


def needed_actions(calls: set[tuple[str, str, frozenset[str]]]) -> set[str]:
    actions = set()
    for service, operation, params in calls:
        actions.add(IAM_ACTION.get((service, operation), f"{service}:{operation}"))
        actions.update(
            a for (s, o, p), a in IMPLIED.items() if (s, o) == (service, operation) and p in params
        )
    return actions


def statements() -> list[dict[str, Any]]:
    policy = json.loads(POLICY.read_text())
    assert policy["Version"] == "2012-10-17"
    return list(policy["Statement"])


def listed(statement: dict[str, Any], key: str) -> list[str]:
    value = statement.get(key, [])
    return [value] if isinstance(value, str) else list(value)


def allowed_actions() -> set[str]:
    return {a for s in statements() if s["Effect"] == "Allow" for a in listed(s, "Action")}


def with_action(action: str) -> Iterator[dict[str, Any]]:
    return (s for s in statements() if action in listed(s, "Action"))


def test_the_policy_allows_exactly_what_the_adapter_calls(
    recorded_calls: set[tuple[str, str, frozenset[str]]], aws_suite_complete: bool
) -> None:
    needed = needed_actions(recorded_calls)
    allowed = allowed_actions()
    missing = needed - allowed
    assert not missing, f"the adapter calls {sorted(missing)}, which the policy does not allow"
    if not aws_suite_complete:
        pytest.skip(
            "the policy covers every call made, but only part of the AWS suite ran: "
            "run all of tests/providers/aws to check that it allows nothing more"
        )
    unused = allowed - needed
    assert not unused, f"the policy allows {sorted(unused)}, which the adapter never calls"
    # Sanity: the suite did exercise every kind of call.
    assert {
        "ec2:RunInstances",
        "ec2:TerminateInstances",
        "ec2:CreateTags",
        "iam:PassRole",
        "pricing:GetProducts",
        "ssm:GetParameter",
        "s3:CreateBucket",
    } <= needed


def test_no_wildcard_actions_and_no_negations() -> None:
    for s in statements():
        assert s["Effect"] == "Allow"
        assert not {"NotAction", "NotResource", "NotPrincipal"} & set(s)
        for action in listed(s, "Action"):
            assert "*" not in action, action


def test_only_reads_apply_to_every_resource() -> None:
    for s in statements():
        if "*" in listed(s, "Resource"):
            for action in listed(s, "Action"):
                verb = action.split(":")[1]
                assert verb.startswith(("Describe", "Get")), action


def test_terminate_is_fenced_by_the_cluster_tag() -> None:
    (statement,) = with_action("ec2:TerminateInstances")
    assert listed(statement, "Action") == ["ec2:TerminateInstances"]
    assert statement["Condition"]["StringEquals"][f"aws:ResourceTag/{CLUSTER_TAG}"] == (
        f"${{aws:PrincipalTag/{CLUSTER_TAG}}}"
    )


def test_instances_and_volumes_are_created_only_tagged_for_the_cluster_with_imdsv2() -> None:
    for s in with_action("ec2:RunInstances"):
        creates = [
            r
            for r in listed(s, "Resource")
            if r.split(":")[-1].split("/")[0] in ("instance", "volume", "spot-instances-request")
        ]
        if not creates:
            continue
        condition = s["Condition"]
        assert condition["StringEquals"][f"aws:RequestTag/{CLUSTER_TAG}"] == (
            f"${{aws:PrincipalTag/{CLUSTER_TAG}}}"
        )
        assert set(condition["ForAllValues:StringEquals"]["aws:TagKeys"]) == {
            CLUSTER_TAG,
            "heliotrope:job",
            "heliotrope:request",
            "heliotrope:gang",  # on ranks 1..N-1 of a gang: rank 0's id
        }
        if any(r.endswith(":instance/*") for r in creates):
            assert condition["StringEquals"]["ec2:MetadataHttpTokens"] == "required"


def test_tags_can_be_written_only_by_a_launch() -> None:
    # Otherwise CreateTags could adopt someone else's instance into the cluster and then
    # TerminateInstances would allow ending it.
    (statement,) = with_action("ec2:CreateTags")
    assert statement["Condition"]["StringEquals"]["ec2:CreateAction"] == "RunInstances"


def test_s3_and_pass_role_are_limited_to_heliotrope_names() -> None:
    for s in statements():
        actions = listed(s, "Action")
        if any(a.startswith("s3:") for a in actions):
            assert listed(s, "Resource") == ["arn:aws:s3:::heliotrope-*"]
        if "iam:PassRole" in actions:
            assert listed(s, "Resource") == ["arn:aws:iam::*:role/heliotrope-*"]
            assert s["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
