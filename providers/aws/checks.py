"""What `heliotrope providers check` asks AWS: who the credentials are, the adapter's reads,
on-demand prices, and `RunInstances` / `TerminateInstances` as dry runs (EC2 answers
`DryRunOperation` when the IAM policy, with its conditions on tags and metadata options,
would allow the real call). Buys and ends nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from orchestrator import catalog
from orchestrator.errors import HeliotropeError
from orchestrator.model import Market
from providers.registry import CheckRow, Result

if TYPE_CHECKING:
    from providers.aws import AwsProvider
    from providers.aws._session import SessionFactory
    from providers.aws.offers import OfferBook
    from providers.aws.spec import AwsSettings

CHECK_REQUEST: Final = "heliotrope-check"
OFFERS_CHECK: Final = "ec2:DescribeInstanceTypes/-TypeOfferings/SpotPriceHistory"


def client(session: Any, service: str, region: str, settings: AwsSettings) -> Any:
    """A boto3 client for the check: two attempts, short timeouts, the VPC endpoints."""
    from botocore.config import Config

    return session.client(
        service,
        region_name=region,
        endpoint_url=settings.endpoint_urls.get(service),
        config=Config(
            retries={"total_max_attempts": 2, "mode": "standard"},
            user_agent_extra="heliotrope-check",
            connect_timeout=10,
            read_timeout=30,
        ),
    )


class _Rows:
    """The rows of a check, and how a failed call becomes one."""

    def __init__(self) -> None:
        self.out: list[CheckRow] = []

    def add(self, check: str, result: Result, reason: str) -> None:
        self.out.append((check, result, reason))

    def failed(self, check: str, exc: BaseException) -> None:
        from providers.aws.errors import failure_of, is_aws_error

        if isinstance(exc, HeliotropeError):
            self.add(check, "fail", str(exc))
        elif is_aws_error(exc):
            self.add(check, "fail", failure_of(exc, action=check).message)
        else:
            raise exc


def _dry_run_allowed(exc: BaseException) -> bool:
    from providers.aws.errors import error_code, is_aws_error

    return is_aws_error(exc) and error_code(exc) == "DryRunOperation"


def check_aws(
    provider: AwsProvider, a: AwsSettings, cluster: str, session_factory: SessionFactory | None
) -> list[CheckRow]:
    from providers.aws._session import default_session

    rows = _Rows()
    regions = provider.regions
    try:
        session = (session_factory or default_session)()
        who = client(session, "sts", regions[0], a).get_caller_identity()
        rows.add("sts:GetCallerIdentity", "ok", f"account {who.get('Account')}, {who.get('Arn')}")
    except Exception as exc:
        rows.failed("sts:GetCallerIdentity", exc)
        rows.add("ec2 and pricing", "skip", "no usable AWS credentials (see above)")
        return rows.out

    instances: Mapping[str, Any] = {}
    try:
        instances = provider.list_instances(cluster=cluster)
        rows.add(
            "ec2:DescribeInstances",
            "ok",
            f"{len(instances)} instance(s) of cluster {cluster} in {', '.join(regions)}",
        )
    except Exception as exc:
        rows.failed("ec2:DescribeInstances", exc)
    book = _check_offers(provider, rows)
    for region in regions:
        _check_run(provider, a, session, cluster, region, book, rows)
    _check_terminate(provider, a, session, cluster, instances, rows)
    return rows.out


def _check_offers(provider: AwsProvider, rows: _Rows) -> OfferBook | None:
    """The adapter's offer reads in every region, and on-demand prices from the Pricing API."""
    from providers.aws.offers import SOURCE_PRICING

    regions = provider.regions
    try:
        book = provider.offer_book(refresh=True)
    except Exception as exc:
        rows.failed(OFFERS_CHECK, exc)
        return None
    per_region = {r: [o for o in book.offers if o.region == r] for r in regions}
    missing = [r for r, found in per_region.items() if not found]
    spot = sum(o.market is Market.SPOT for o in book.offers)
    if missing:
        rows.add(OFFERS_CHECK, "fail", f"no offers read in {', '.join(missing)} (see the log)")
    else:
        rows.add(
            OFFERS_CHECK, "ok", f"{len(book.offers)} offers ({spot} spot) in {', '.join(regions)}"
        )
    on_demand = [o for o in book.offers if o.market is Market.ON_DEMAND]
    if not on_demand:
        rows.add("pricing:GetProducts", "skip", "no on-demand offers to price")
    elif any(book.price_source.get(o.id) == SOURCE_PRICING for o in on_demand):
        rows.add("pricing:GetProducts", "ok", "on-demand prices from the Pricing API")
    else:
        rows.add(
            "pricing:GetProducts",
            "fail",
            "the Pricing API gave no price (see the log); catalog list prices are used",
        )
    return book


def _check_run(
    provider: AwsProvider,
    a: AwsSettings,
    session: Any,
    cluster: str,
    region: str,
    book: OfferBook | None,
    rows: _Rows,
) -> None:
    """`RunInstances` as a dry run of exactly the request a launch sends (tags, IMDSv2,
    market options): the IAM policy's conditions on tags and metadata are checked too."""
    from providers.aws.instances import parse_offer_id
    from providers.base import LaunchSpec

    check = f"ec2:RunInstances dry run {region}"
    usd = {} if book is None else book.usd_per_hour
    offers = (
        []
        if book is None
        else sorted(
            (o for o in book.offers if o.region == region and o.id in usd),
            key=lambda o: (o.market is not Market.SPOT, usd[o.id], o.id),
        )
    )
    if not offers:
        rows.add(check, "skip", "no priced offer in this region to try")
        return
    offer = offers[0]
    parsed = parse_offer_id(offer.id)
    assert parsed is not None
    zone, instance_type, market = parsed
    request_id = f"{CHECK_REQUEST}-{uuid.uuid4().hex[:12]}"
    try:
        spec = LaunchSpec(
            job_id=CHECK_REQUEST, offer_id=offer.id, cluster=cluster, entrypoint=("true",)
        )
        params = dict(provider.launch_request(spec, request_id=request_id))
        client(session, "ec2", region, a).run_instances(**params, DryRun=True)
        rows.add(check, "fail", "the dry run was not refused: EC2 ignored DryRun")
    except Exception as exc:
        if _dry_run_allowed(exc):
            rows.add(
                check,
                "ok",
                f"allowed: {market.value} {instance_type} in {zone}, tagged "
                f"heliotrope:cluster={cluster}, IMDSv2",
            )
        else:
            rows.failed(check, exc)


def _check_terminate(
    provider: AwsProvider,
    a: AwsSettings,
    session: Any,
    cluster: str,
    instances: Mapping[str, Any],
    rows: _Rows,
) -> None:
    """`TerminateInstances` as a dry run, per region, on one of the cluster's instances."""
    from providers.aws.instances import parse_offer_id

    by_region: dict[str, str] = {}
    for instance_id, info in sorted(instances.items()):
        parsed = parse_offer_id(info.offer_id)
        if parsed is not None:
            by_region.setdefault(catalog.region_of_zone(provider.name, parsed[0]), instance_id)
    for region in provider.regions:
        check = f"ec2:TerminateInstances dry run {region}"
        victim = by_region.get(region)
        if victim is None:
            rows.add(
                check,
                "skip",
                f"no instance of cluster {cluster} here to try (the "
                "policy lets it terminate only instances tagged with its cluster)",
            )
            continue
        try:
            client(session, "ec2", region, a).terminate_instances(InstanceIds=[victim], DryRun=True)
            rows.add(check, "fail", "the dry run was not refused: EC2 ignored DryRun")
        except Exception as exc:
            if _dry_run_allowed(exc):
                rows.add(check, "ok", f"allowed on {victim} (cluster {cluster})")
            else:
                rows.failed(check, exc)
