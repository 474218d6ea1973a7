"""The checkpoint bucket helper over real HTTP: moto's server on 127.0.0.1, the adapter's
S3 client pointed at it with `endpoint_urls`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator.errors import InputError, PermanentError
from providers.aws import TAG_CLUSTER, AwsProvider

from .conftest import CLUSTER, REGIONS, new_session


@pytest.fixture(scope="module")
def s3_url() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_provider(s3_url: str, session_factory: Callable[[], Any]) -> Callable[..., AwsProvider]:
    def make(cluster: str = CLUSTER) -> AwsProvider:
        return AwsProvider(
            cluster=cluster,
            regions=REGIONS,
            session_factory=session_factory,
            endpoint_urls={"s3": s3_url},
        )

    return make


@pytest.fixture
def s3(s3_url: str) -> Any:
    """A plain client on the same server, to look at what the helper did."""
    return new_session().client("s3", region_name="us-east-1", endpoint_url=s3_url)


def test_creates_a_private_encrypted_tagged_bucket(
    s3_provider: Callable[..., AwsProvider], s3: Any
) -> None:
    uri = s3_provider().ensure_checkpoint_bucket("eu-west-1", "heliotrope-test-euw1")

    assert uri == "s3://heliotrope-test-euw1"
    assert s3.get_bucket_location(Bucket="heliotrope-test-euw1")["LocationConstraint"] == (
        "eu-west-1"
    )
    rules = s3.get_bucket_encryption(Bucket="heliotrope-test-euw1")[
        "ServerSideEncryptionConfiguration"
    ]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    block = s3.get_public_access_block(Bucket="heliotrope-test-euw1")[
        "PublicAccessBlockConfiguration"
    ]
    assert block == {
        "BlockPublicAcls": True,
        "IgnorePublicAcls": True,
        "BlockPublicPolicy": True,
        "RestrictPublicBuckets": True,
    }
    tags = s3.get_bucket_tagging(Bucket="heliotrope-test-euw1")["TagSet"]
    assert {"Key": TAG_CLUSTER, "Value": CLUSTER} in tags


def test_is_idempotent_and_keeps_other_tags(
    s3_provider: Callable[..., AwsProvider], s3: Any
) -> None:
    provider = s3_provider()
    provider.ensure_checkpoint_bucket("us-east-1", "heliotrope-test-use1")
    s3.put_bucket_tagging(
        Bucket="heliotrope-test-use1",
        Tagging={
            "TagSet": [{"Key": TAG_CLUSTER, "Value": CLUSTER}, {"Key": "team", "Value": "ml"}]
        },
    )

    assert provider.ensure_checkpoint_bucket("us-east-1", "heliotrope-test-use1") == (
        "s3://heliotrope-test-use1"
    )
    tags = {
        t["Key"]: t["Value"] for t in s3.get_bucket_tagging(Bucket="heliotrope-test-use1")["TagSet"]
    }
    assert tags == {TAG_CLUSTER: CLUSTER, "team": "ml"}


def test_kms_encryption(s3_provider: Callable[..., AwsProvider], s3: Any) -> None:
    s3_provider().ensure_checkpoint_bucket(
        "us-west-2", "heliotrope-test-kms", kms_key_id="alias/heliotrope"
    )
    rule = s3.get_bucket_encryption(Bucket="heliotrope-test-kms")[
        "ServerSideEncryptionConfiguration"
    ]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"] == {
        "SSEAlgorithm": "aws:kms",
        "KMSMasterKeyID": "alias/heliotrope",
    }


def test_a_bucket_of_another_cluster_is_left_alone(
    s3_provider: Callable[..., AwsProvider], s3: Any
) -> None:
    s3.create_bucket(Bucket="heliotrope-theirs")
    s3.put_bucket_tagging(
        Bucket="heliotrope-theirs", Tagging={"TagSet": [{"Key": TAG_CLUSTER, "Value": "other"}]}
    )

    with pytest.raises(PermanentError, match="belongs to cluster 'other'"):
        s3_provider().ensure_checkpoint_bucket("us-east-1", "heliotrope-theirs")

    assert "ServerSideEncryptionConfiguration" not in _encryption(s3, "heliotrope-theirs")


def test_names_outside_the_heliotrope_prefix_are_refused(
    s3_provider: Callable[..., AwsProvider],
) -> None:
    with pytest.raises(InputError, match="heliotrope-"):
        s3_provider().ensure_checkpoint_bucket("us-east-1", "company-data")


def _encryption(s3: Any, bucket: str) -> dict[str, Any]:
    from botocore.exceptions import ClientError

    try:
        return dict(s3.get_bucket_encryption(Bucket=bucket))
    except ClientError:
        return {}


def test_a_bucket_in_another_region_is_refused(
    s3_provider: Callable[..., AwsProvider], s3: Any
) -> None:
    s3.create_bucket(
        Bucket="heliotrope-test-moved",
        CreateBucketConfiguration={"LocationConstraint": "eu-central-1"},
    )
    with pytest.raises(PermanentError, match="is in eu-central-1, not us-west-2"):
        s3_provider().ensure_checkpoint_bucket("us-west-2", "heliotrope-test-moved")
    assert _encryption(s3, "heliotrope-test-moved") == {}
