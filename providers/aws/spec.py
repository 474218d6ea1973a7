"""AWS in the cloud registry (providers/registry.py): settings, build, check, and facts.

The `aws:` section of the clouds settings:

    aws:
      regions: [us-east-1, us-west-2]
      instance_profile: heliotrope-job   # the job's own role, for checkpoints
      subnet_ids: {us-east-1: subnet-0abc}
      endpoint_urls: {ec2: https://vpce-...}   # VPC endpoints by service
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import catalog
from orchestrator.errors import InputError
from providers.registry import BuildContext, CheckRow, CloudSpec

if TYPE_CHECKING:
    from providers.aws import AwsProvider
    from providers.aws._session import SessionFactory

CLOUD: Final = "aws"


class AwsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    regions: list[str] = Field(min_length=1)
    image_id: str | dict[str, str] | None = None
    ami_parameter: str | None = None
    instance_profile: str | None = None
    subnet_ids: dict[str, str] = Field(default_factory=dict)
    security_group_ids: list[str] = Field(default_factory=list)
    pricing_region: str = "us-east-1"
    endpoint_urls: dict[str, str] = Field(default_factory=dict)  # VPC endpoints by service


class AwsAccess(BaseModel):
    """`CloudAccess` for AWS: a boto3 session factory (an assumed role, a test's hooks)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    session_factory: Any = None  # SessionFactory: () -> boto3.Session


def _session_factory(ctx: BuildContext) -> SessionFactory | None:
    access = ctx.access
    return access.session_factory if isinstance(access, AwsAccess) else None


def build(a: AwsSettings, ctx: BuildContext) -> AwsProvider:
    from providers.aws import DEFAULT_AMI_PARAMETER, AwsProvider

    for region in a.regions:
        if region not in catalog.regions(CLOUD):
            raise InputError(
                "clouds settings",
                "aws.regions",
                "AWS regions of the catalog",
                got=repr(region),
                fix="e.g. us-east-1 (docs/signals.md lists them)",
            )
    return AwsProvider(
        cluster=ctx.cluster,
        regions=a.regions,
        session_factory=_session_factory(ctx),
        clock=ctx.clock,
        pricing_region=a.pricing_region,
        image_id=a.image_id,
        ami_parameter=a.ami_parameter or DEFAULT_AMI_PARAMETER,
        instance_profile=a.instance_profile,
        subnet_ids=a.subnet_ids,
        security_group_ids=a.security_group_ids,
        sleep=ctx.sleep,
        endpoint_urls=a.endpoint_urls or None,
    )


def check(provider: AwsProvider, a: AwsSettings, ctx: BuildContext) -> list[CheckRow]:
    from providers.aws.checks import check_aws

    return check_aws(provider, a, ctx.cluster, _session_factory(ctx))


SPEC: Final = CloudSpec(
    name=CLOUD,
    title="AWS",
    settings_model=AwsSettings,
    build=build,
    check=check,
    geography=catalog.geography(CLOUD),
    egress=catalog.egress_of(CLOUD),
    infra=("infra/aws/iam-policy.json",),
    notice_source=CLOUD,
    price_sources=("aws-spot-price", "aws-ondemand"),
    capacity_sources=("aws-placement-score", "aws-spot-advisor"),
    connection_id="aws_default",
    secret_env=(
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ACCESS_KEY_ID",
    ),
    secret_patterns=(re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),),
)
