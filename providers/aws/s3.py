"""S3 buckets for checkpoints: one per region, named `heliotrope-*`, private and encrypted.

`ensure_checkpoint_bucket` is idempotent: it creates the bucket when it is missing, then
makes sure of server-side encryption (SSE-S3 AES256 by default, SSE-KMS with a key id),
a public access block with all four settings on, and the `heliotrope:cluster` tag. A bucket
tagged for another cluster, living in another region, or owned by someone else is refused
and left as it is. Other tags on a bucket are kept.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Final

from orchestrator.errors import InputError
from providers.aws.errors import AwsPermanentError, EdgeRetry, error_code
from providers.aws.instances import TAG_CLUSTER
from providers.base import FailureKind, ProviderFailure

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ServerSideEncryptionRuleTypeDef, TagTypeDef

logger = logging.getLogger(__name__)

BUCKET_PREFIX: Final = "heliotrope-"  # the IAM policy grants S3 on these names only
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_DEFAULT_REGION: Final = "us-east-1"  # the one region CreateBucket takes no constraint for


def check_bucket_name(name: str) -> None:
    if not name.startswith(BUCKET_PREFIX) or not _BUCKET_NAME.fullmatch(name) or ".." in name:
        raise InputError(
            "checkpoint bucket",
            "name",
            f"an S3 bucket name starting with {BUCKET_PREFIX!r} "
            "(3-63 lower-case letters, digits, '.' and '-')",
            got=repr(name),
            fix=f"name it {BUCKET_PREFIX}<cluster>-<region>",
        )


def _refuse(message: str) -> AwsPermanentError:
    return AwsPermanentError(ProviderFailure(FailureKind.INVALID, message))


def ensure_checkpoint_bucket(
    s3: S3Client,
    retry: EdgeRetry,
    *,
    region: str,
    name: str,
    cluster: str,
    kms_key_id: str | None = None,
) -> str:
    """Make sure bucket `name` exists in `region`, private, encrypted and tagged with
    `cluster`; returns its `s3://` URI. botocore errors propagate (the caller maps them)."""
    from botocore.exceptions import ClientError

    check_bucket_name(name)
    action = f"s3 {name}"
    try:
        head = retry(lambda: s3.head_bucket(Bucket=name), f"s3:HeadBucket {name}")
    except ClientError as exc:
        if error_code(exc) in ("403", "AccessDenied", "Forbidden"):
            raise _refuse(
                f"{action}: the bucket exists but is not readable by us (another "
                "account's, or a missing permission); choose another name"
            ) from exc
        if error_code(exc) not in ("404", "NoSuchBucket", "NotFound"):
            raise
        _create(s3, retry, region=region, name=name)
    else:
        where = head.get("BucketRegion")
        if where and where != region:
            raise _refuse(
                f"{action}: the bucket is in {where}, not {region}; use one bucket per region"
            )

    try:
        tag_set = retry(
            lambda: s3.get_bucket_tagging(Bucket=name), f"s3:GetBucketTagging {name}"
        ).get("TagSet", [])
    except ClientError as exc:
        if error_code(exc) != "NoSuchTagSet":
            raise
        tag_set = []
    tags = {t["Key"]: t["Value"] for t in tag_set}
    owner = tags.get(TAG_CLUSTER)
    if owner is not None and owner != cluster:
        raise _refuse(
            f"{action}: the bucket belongs to cluster {owner!r}, not {cluster!r}; "
            "it was left as it is"
        )

    rule: ServerSideEncryptionRuleTypeDef = (
        {
            "ApplyServerSideEncryptionByDefault": {
                "SSEAlgorithm": "aws:kms",
                "KMSMasterKeyID": kms_key_id,
            },
            "BucketKeyEnabled": True,
        }
        if kms_key_id
        else {"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
    )
    retry(
        lambda: s3.put_bucket_encryption(
            Bucket=name, ServerSideEncryptionConfiguration={"Rules": [rule]}
        ),
        f"s3:PutBucketEncryption {name}",
    )
    retry(
        lambda: s3.put_public_access_block(
            Bucket=name,
            PublicAccessBlockConfiguration={
                "BlockPublicAcls": True,
                "IgnorePublicAcls": True,
                "BlockPublicPolicy": True,
                "RestrictPublicBuckets": True,
            },
        ),
        f"s3:PutPublicAccessBlock {name}",
    )
    if owner != cluster:
        merged: list[TagTypeDef] = [{"Key": k, "Value": v} for k, v in tags.items()]
        merged.append({"Key": TAG_CLUSTER, "Value": cluster})
        retry(
            lambda: s3.put_bucket_tagging(Bucket=name, Tagging={"TagSet": merged}),
            f"s3:PutBucketTagging {name}",
        )
    logger.info(
        "checkpoint bucket s3://%s ready in %s (encryption %s, public access blocked)",
        name,
        region,
        "aws:kms" if kms_key_id else "AES256",
    )
    return f"s3://{name}"


def _create(s3: S3Client, retry: EdgeRetry, *, region: str, name: str) -> None:
    from botocore.exceptions import ClientError

    try:
        if region == _DEFAULT_REGION:
            retry(lambda: s3.create_bucket(Bucket=name), f"s3:CreateBucket {name}")
        else:
            retry(
                lambda: s3.create_bucket(
                    Bucket=name,
                    CreateBucketConfiguration={"LocationConstraint": region},  # type: ignore[typeddict-item]
                ),
                f"s3:CreateBucket {name}",
            )
    except ClientError as exc:
        code = error_code(exc)
        if code == "BucketAlreadyOwnedByYou":
            return  # created by a concurrent call of ours
        if code == "BucketAlreadyExists":
            raise _refuse(
                f"s3 {name}: the name is taken by another account; choose another"
            ) from exc
        raise
    logger.info("created checkpoint bucket s3://%s in %s", name, region)
