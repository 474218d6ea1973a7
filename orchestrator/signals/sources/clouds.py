"""Cloud signals: AWS spot prices, placement scores, Spot Advisor bands, on-demand prices,
and GCP prices from the Cloud Billing Catalog.

The AWS sources call boto3 through `providers.aws` (`Clients` for per-thread clients with an
endpoint override, `EdgeRetry` for retries with an injected sleep, `raise_mapped` for the
error mapping, `fetch_on_demand` for the Pricing API). The GCP source fetches the catalog
pages itself (so a 401, a 429 or a malformed page is reported, not swallowed) and prices
machines with `providers.gcp.billing.parse_skus` / `ComputeRates.machine_usd_per_hour`.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar

import pandas as pd
from pydantic import Field, field_validator

from orchestrator import catalog
from orchestrator.errors import HeliotropeError
from orchestrator.model import Market, SignalKind
from orchestrator.signals.sources.base import (
    KeyedSource,
    Obs,
    ReadsAll,
    SourceContext,
    Strict,
    Time,
    decode_json,
    make_frame,
    utc,
    validate,
)
from orchestrator.signals.sources.errors import MalformedResponse, short
from orchestrator.signals.sources.keys import price_key, spot_key

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_pricing import PricingClient

logger = logging.getLogger(__name__)

T = TypeVar("T")

AWS_ENDPOINT_ENV: Final = "HELIOTROPE_AWS_ENDPOINT_URL"
PRICING_REGION: Final = "us-east-1"  # the Pricing API answers from us-east-1
SPOT_PRICE_GRACE: Final = timedelta(hours=1)
PLACEMENT_VALID: Final = timedelta(hours=6)
ADVISOR_VALID: Final = timedelta(days=2)
ON_DEMAND_VALID: Final = timedelta(days=7)
GCP_PRICE_VALID: Final = timedelta(days=2)


def aws_gpu_types() -> tuple[str, ...]:
    """The AWS GPU instance types the catalog lists with a price (a poll's default)."""
    return tuple(sorted(t for c, t in catalog.LIST_PRICES if c == "aws"))


class AwsClients(Protocol):
    def ec2(self, region: str) -> EC2Client: ...

    def pricing(self, region: str) -> PricingClient: ...


def default_aws_clients(env: Mapping[str, str] | None = None) -> AwsClients:
    from providers.aws._session import Clients

    endpoint = (os.environ if env is None else env).get(AWS_ENDPOINT_ENV, "")
    urls = {"ec2": endpoint, "pricing": endpoint} if endpoint else {}
    return Clients(endpoint_urls=urls)


class _AwsBase(ReadsAll):
    name: ClassVar[str] = ""
    kind: ClassVar[SignalKind] = SignalKind.PRICE
    history: ClassVar[bool] = False
    terms: ClassVar[str] = "AWS API data (your account's view)"
    back: ClassVar[timedelta] = timedelta(hours=1)

    def __init__(self, ctx: SourceContext) -> None:
        from providers.aws.errors import EdgeRetry

        self.ctx = ctx
        clients = ctx.options.get("aws_clients")
        self.clients: AwsClients = clients if clients is not None else default_aws_clients(ctx.env)
        self.retry = EdgeRetry(ctx.sleep, attempts=int(ctx.options.get("aws_attempts", 4)))
        types = ctx.options.get("aws_instance_types")
        self.instance_types: tuple[str, ...] = tuple(types) if types else aws_gpu_types()

    def call(self, fn: Callable[[], T], action: str) -> T:
        """`fn` through the edge retry; botocore errors mapped to Heliotrope's."""
        from providers.aws.errors import is_aws_error, raise_mapped

        try:
            return self.retry(fn, action)
        except Exception as exc:
            if is_aws_error(exc):
                raise_mapped(exc, action=action)
            raise

    def default_keys(self, regions: Sequence[tuple[str, str]]) -> list[str]:
        return sorted({r for c, r in regions if c == "aws"})

    def poll_window(self, now: datetime) -> tuple[datetime, datetime]:
        now = utc(now)
        return now - self.back, now


# -- spot price history -------------------------------------------------------------------


class SpotPriceRecord(Strict):
    AvailabilityZone: str = Field(min_length=1)
    InstanceType: str = Field(min_length=1)
    SpotPrice: float = Field(gt=0)
    Timestamp: Time


class SpotPricePage(Strict):
    SpotPriceHistory: list[SpotPriceRecord] = Field(default_factory=list)


def parse_spot_price_pages(
    pages: Sequence[Any],
    region: str,
    start: datetime,
    end: datetime,
    now: datetime,
    source: str = "aws-spot-price",
) -> list[Obs]:
    """DescribeSpotPriceHistory pages -> a change log per (zone, instance type). A record
    before `start` is the price in effect at `start` (AWS returns it): it is moved to
    `start`. Each price holds until the next record of its key; the last one until `end`
    (plus an hour when `end` is now, for the next poll to come)."""
    # (zone, type) -> slot time -> (the record's own time, price)
    records: dict[tuple[str, str], dict[datetime, tuple[datetime, float]]] = {}
    for n, page in enumerate(pages):
        parsed = validate(SpotPricePage, page, source, f"page[{n}]")
        for r in parsed.SpotPriceHistory:
            if catalog.region_of_zone("aws", r.AvailabilityZone) != region:
                raise MalformedResponse(
                    source,
                    f"page[{n}].AvailabilityZone",
                    f"expected a zone of {region}, got {short(r.AvailabilityZone)}",
                )
            stamp = r.Timestamp.astimezone(UTC)
            when = max(stamp, start)
            slot = records.setdefault((r.AvailabilityZone, r.InstanceType), {})
            # Of the records moved to `start`, the newest is the price in effect then.
            if when not in slot or stamp >= slot[when][0]:
                slot[when] = (stamp, r.SpotPrice)
    tail = SPOT_PRICE_GRACE if end >= now - timedelta(minutes=1) else timedelta(0)
    out: list[Obs] = []
    for (zone, instance_type), series in sorted(records.items()):
        times = sorted(t for t in series if t <= end)
        for i, when in enumerate(times):
            until = times[i + 1] if i + 1 < len(times) else end + tail
            out.append(
                Obs(
                    when,
                    price_key("aws", region, zone, instance_type, "spot"),
                    series[when][1],
                    "usd_per_hour",
                    until,
                    source,
                )
            )
    return out


class AwsSpotPrice(_AwsBase):
    """EC2 DescribeSpotPriceHistory (Linux/UNIX), paginated, per region and zone."""

    name: ClassVar[str] = "aws-spot-price"
    kind: ClassVar[SignalKind] = SignalKind.PRICE
    history: ClassVar[bool] = True  # AWS keeps 90 days

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        from providers.aws.offers import spot_price_pages  # the adapter's reader

        start, end = utc(start), utc(end)
        now = self.ctx.clock.now()
        rows: list[Obs] = []
        errors: dict[str, HeliotropeError] = {}
        for region in keys:
            try:
                pages = spot_price_pages(
                    self.clients.ec2(region), self.call, region, self.instance_types, start, end
                )
                rows.extend(parse_spot_price_pages(pages, region, start, end, now, self.name))
            except HeliotropeError as exc:
                errors[region] = exc
        return make_frame(rows, self.kind, now), errors


# -- spot placement scores ----------------------------------------------------------------


class PlacementScore(Strict):
    Region: str
    AvailabilityZoneId: str | None = None
    Score: int = Field(ge=1, le=10)


class PlacementPage(Strict):
    SpotPlacementScores: list[PlacementScore] = Field(default_factory=list)


class AzInfo(Strict):
    ZoneName: str
    ZoneId: str


class AzPage(Strict):
    AvailabilityZones: list[AzInfo] = Field(default_factory=list)


def parse_placement_scores(
    pages: Sequence[Any],
    instance_type: str,
    zone_names: Mapping[str, str],
    now: datetime,
    source: str = "aws-placement-score",
) -> list[Obs]:
    out = []
    for n, page in enumerate(pages):
        for s in validate(PlacementPage, page, source, f"page[{n}]").SpotPlacementScores:
            zone = zone_names.get(s.AvailabilityZoneId or "", s.AvailabilityZoneId or "")
            out.append(
                Obs(
                    now,
                    spot_key("aws", s.Region, zone, instance_type),
                    float(s.Score),
                    "placement_score",
                    now + PLACEMENT_VALID,
                    source,
                )
            )
    return out


class AwsPlacementScore(_AwsBase):
    """EC2 GetSpotPlacementScores, one configuration per instance type (single-AZ scores,
    `target capacity` instances), zone ids named by DescribeAvailabilityZones. AWS allows
    few distinct configurations a day: poll it daily with a short type list."""

    name: ClassVar[str] = "aws-placement-score"
    kind: ClassVar[SignalKind] = SignalKind.SPOT_AVAILABILITY

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        del start, end
        now = self.ctx.clock.now()
        capacity = int(self.ctx.options.get("aws_placement_capacity", 1))
        rows: list[Obs] = []
        errors: dict[str, HeliotropeError] = {}
        names: dict[str, str] = {}
        for region in keys:
            try:
                ec2 = self.clients.ec2(region)
                page = self.call(
                    lambda ec2=ec2: ec2.describe_availability_zones(),  # type: ignore[misc]
                    f"ec2:DescribeAvailabilityZones {region}",
                )
                for az in validate(AzPage, page, self.name, region).AvailabilityZones:
                    names[az.ZoneId] = az.ZoneName
            except HeliotropeError as exc:
                errors[region] = exc
        regions = [r for r in keys if r not in errors]
        if not regions:
            return make_frame(rows, self.kind, now), errors
        ec2 = self.clients.ec2(PRICING_REGION)
        for instance_type in self.instance_types:
            try:
                paginator = ec2.get_paginator("get_spot_placement_scores")

                def fetch(it: str = instance_type, paginator: Any = paginator) -> list[Any]:
                    return list(
                        paginator.paginate(
                            InstanceTypes=[it],
                            TargetCapacity=capacity,
                            TargetCapacityUnitType="units",
                            SingleAvailabilityZone=True,
                            RegionNames=regions,
                        )
                    )

                pages = self.call(fetch, f"ec2:GetSpotPlacementScores {instance_type}")
                rows.extend(parse_placement_scores(pages, instance_type, names, now, self.name))
            except HeliotropeError as exc:
                errors[instance_type] = exc
        return make_frame(rows, self.kind, now), errors


# -- on-demand prices ---------------------------------------------------------------------


class AwsOnDemand(_AwsBase):
    """On-demand $/h per region and instance type from the Pricing API (GetProducts, via
    `providers.aws.offers.fetch_on_demand`). A type the API does not list in a region gets
    no row (not sold there)."""

    name: ClassVar[str] = "aws-ondemand"
    terms: ClassVar[str] = "AWS Price List API"
    kind: ClassVar[SignalKind] = SignalKind.PRICE

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        from providers.aws.offers import fetch_on_demand

        del start, end
        now = self.ctx.clock.now()
        rows: list[Obs] = []
        errors: dict[str, HeliotropeError] = {}
        pricing = self.clients.pricing(PRICING_REGION)
        for region in keys:
            try:
                for it in self.instance_types:
                    usd = self.call(
                        lambda it=it, region=region: fetch_on_demand(  # type: ignore[misc]
                            pricing, self.retry, region, it
                        ),
                        f"pricing:GetProducts {region} {it}",
                    )
                    if usd is None:
                        continue
                    if not (math.isfinite(usd) and usd > 0):
                        raise MalformedResponse(
                            self.name,
                            f"{region} {it} price",
                            f"expected a positive price, got {usd}",
                        )
                    rows.append(
                        Obs(
                            now,
                            price_key("aws", region, "", it, "on_demand"),
                            usd,
                            "usd_per_hour",
                            now + ON_DEMAND_VALID,
                            self.name,
                        )
                    )
            except HeliotropeError as exc:
                errors[region] = exc
        return make_frame(rows, self.kind, now), errors


# -- Spot Advisor -------------------------------------------------------------------------

ADVISOR_DEFAULT_URL: Final = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"


class AdvisorRange(Strict):
    index: int = Field(ge=0)
    label: str
    max: float = Field(ge=0, le=100)


class AdvisorEntry(Strict):
    s: float = Field(ge=0, le=100)
    r: int = Field(ge=0)


class AdvisorData(Strict):
    ranges: list[AdvisorRange] = Field(min_length=1)
    spot_advisor: dict[str, dict[str, dict[str, AdvisorEntry]]]

    @field_validator("ranges")
    @classmethod
    def _distinct(cls, v: list[AdvisorRange]) -> list[AdvisorRange]:
        if len({r.index for r in v}) != len(v):
            raise ValueError("range indexes repeat")
        return v


def parse_spot_advisor(
    body: bytes | str,
    regions: Sequence[str],
    instance_types: Sequence[str] | None,
    now: datetime,
    source: str = "aws-spot-advisor",
) -> list[Obs]:
    """Linux rows of the Spot Advisor JSON for `regions`: the interruption band's upper
    bound (%) and the saving (%), per GPU instance type the catalog knows."""
    data = validate(AdvisorData, decode_json(body, source), source)
    bands = {r.index: r.max for r in data.ranges}
    wanted = set(instance_types) if instance_types else None
    out = []
    for region in regions:
        for it, entry in sorted(data.spot_advisor.get(region, {}).get("Linux", {}).items()):
            if catalog.instance_gpus("aws", it) is None or (wanted and it not in wanted):
                continue
            if entry.r not in bands:
                raise MalformedResponse(
                    source,
                    f"spot_advisor.{region}.Linux.{it}.r",
                    f"expected one of the range indexes, got {entry.r}",
                )
            key = spot_key("aws", region, "", it)
            until = now + ADVISOR_VALID
            out.append(Obs(now, key, bands[entry.r], "interruption_pct_max", until, source))
            out.append(Obs(now, key, entry.s, "savings_pct", until, source))
    return out


class AwsSpotAdvisor(_AwsBase):
    """The public Spot Advisor JSON (interruption-frequency bands, savings), read with
    requests; no credential."""

    name: ClassVar[str] = "aws-spot-advisor"
    terms: ClassVar[str] = "AWS public Spot Advisor data"
    kind: ClassVar[SignalKind] = SignalKind.SPOT_AVAILABILITY

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        del start, end
        now = self.ctx.clock.now()
        url = self.ctx.base_url(self.name, ADVISOR_DEFAULT_URL)
        try:
            body = self.ctx.http.get(self.name, url).body
            types = self.ctx.options.get("aws_instance_types")
            rows = parse_spot_advisor(body, keys, types, now, self.name)
        except HeliotropeError as exc:
            return make_frame([], self.kind, now), {"*": exc}
        return make_frame(rows, self.kind, now), {}


# -- GCP Cloud Billing Catalog ------------------------------------------------------------

GCP_BILLING_DEFAULT_URL: Final = "https://cloudbilling.googleapis.com"
GCP_KEY_ENV: Final = "GCP_BILLING_API_KEY"
GCP_PAGE_SIZE: Final = 5000
GCP_MAX_PAGES: Final = 200
# (vCPUs, memory GiB) of the GPU machine types (GCP "GPU machine types": A2, A3, G2 tables).
GCP_MACHINE_SHAPES: Final[Mapping[str, tuple[int, float]]] = {
    "a2-highgpu-1g": (12, 85.0),
    "a2-highgpu-2g": (24, 170.0),
    "a2-highgpu-4g": (48, 340.0),
    "a2-highgpu-8g": (96, 680.0),
    "a2-megagpu-16g": (96, 1360.0),
    "a2-ultragpu-1g": (12, 170.0),
    "a2-ultragpu-2g": (24, 340.0),
    "a2-ultragpu-4g": (48, 680.0),
    "a2-ultragpu-8g": (96, 1360.0),
    "a3-highgpu-1g": (26, 234.0),
    "a3-highgpu-2g": (52, 468.0),
    "a3-highgpu-4g": (104, 936.0),
    "a3-highgpu-8g": (208, 1872.0),
    "a3-megagpu-8g": (208, 1872.0),
    "a3-edgegpu-8g": (208, 1872.0),
    "g2-standard-4": (4, 16.0),
    "g2-standard-8": (8, 32.0),
    "g2-standard-12": (12, 48.0),
    "g2-standard-16": (16, 64.0),
    "g2-standard-24": (24, 96.0),
    "g2-standard-32": (32, 128.0),
    "g2-standard-48": (48, 192.0),
    "g2-standard-96": (96, 384.0),
}


class GcpMoney(Strict):
    currencyCode: str = "USD"  # noqa: N815
    units: int = Field(default=0, ge=0)
    nanos: int = Field(default=0, ge=0, lt=1_000_000_000)


class GcpTier(Strict):
    startUsageAmount: float = Field(default=0.0, ge=0)  # noqa: N815
    unitPrice: GcpMoney  # noqa: N815


class GcpExpression(Strict):
    usageUnit: str  # noqa: N815
    tieredRates: list[GcpTier] = Field(default_factory=list)  # noqa: N815


class GcpPricingInfo(Strict):
    pricingExpression: GcpExpression  # noqa: N815


class GcpCategory(Strict):
    resourceFamily: str = ""  # noqa: N815
    usageType: str = ""  # noqa: N815


class GcpSku(Strict):
    description: str
    category: GcpCategory
    serviceRegions: list[str] = Field(default_factory=list)  # noqa: N815
    pricingInfo: list[GcpPricingInfo] = Field(default_factory=list)  # noqa: N815


class GcpSkuPage(Strict):
    skus: list[GcpSku] = Field(default_factory=list)
    nextPageToken: str | None = None  # noqa: N815


def parse_gcp_sku_page(body: bytes | str, source: str = "gcp-billing") -> tuple[list[Any], str]:
    """One `services.skus.list` page: its SKUs (validated, as dicts) and the next token."""
    raw = decode_json(body, source)
    page = validate(GcpSkuPage, raw, source)
    skus = [s.model_dump(by_alias=True) for s in page.skus]
    return skus, page.nextPageToken or ""


def gcp_prices(
    skus: Sequence[Mapping[str, Any]],
    regions: Sequence[str],
    machine_types: Sequence[str],
    now: datetime,
    source: str = "gcp-billing",
) -> list[Obs]:
    """Machine prices (on-demand and spot) per region from SKU rates; a machine whose
    GPU, core or RAM SKU is missing in a region gets no row there."""
    from providers.gcp.billing import parse_skus

    try:
        rates = parse_skus(skus)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise MalformedResponse(source, "skus", type(exc).__name__) from None
    out = []
    for region in regions:
        for mt in machine_types:
            gpus = catalog.instance_gpus("gcp", mt)
            shape = GCP_MACHINE_SHAPES.get(mt)
            if gpus is None or shape is None:
                continue
            for market in (Market.ON_DEMAND, Market.SPOT):
                usd = rates.machine_usd_per_hour(
                    mt, region, market, gpu_count=gpus[1], vcpus=shape[0], memory_gib=shape[1]
                )
                if usd is None or not usd > 0:
                    continue
                out.append(
                    Obs(
                        now,
                        price_key("gcp", region, "", mt, market.value),
                        usd,
                        "usd_per_hour",
                        now + GCP_PRICE_VALID,
                        source,
                    )
                )
    return out


class GcpBilling(KeyedSource):
    """Compute Engine GPU machine prices per region from the Cloud Billing Catalog API
    (API key in the ``X-Goog-Api-Key`` header), all pages following ``nextPageToken``."""

    name: ClassVar[str] = "gcp-billing"
    terms: ClassVar[str] = "Google Cloud Billing Catalog API"
    kind: ClassVar[SignalKind] = SignalKind.PRICE
    history: ClassVar[bool] = False
    back: ClassVar[timedelta] = timedelta(hours=1)

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.url = ctx.base_url(self.name, GCP_BILLING_DEFAULT_URL)
        types = ctx.options.get("gcp_machine_types")
        self.machine_types = tuple(types) if types else tuple(GCP_MACHINE_SHAPES)

    def default_keys(self, regions: Sequence[tuple[str, str]]) -> list[str]:
        return sorted({r for c, r in regions if c == "gcp"})

    def fetch_skus(self) -> list[Any]:
        from providers.gcp.billing import COMPUTE_SERVICE_ID

        api_key = self.ctx.credential(self.name, GCP_KEY_ENV)
        url = f"{self.url}/v1/services/{COMPUTE_SERVICE_ID}/skus"
        skus: list[Any] = []
        token = ""
        for _ in range(GCP_MAX_PAGES):
            params = {"currencyCode": "USD", "pageSize": str(GCP_PAGE_SIZE)}
            if token:
                params["pageToken"] = token
            body = self.ctx.http.get(
                self.name,
                url,
                params=params,
                headers={"X-Goog-Api-Key": api_key},
                secrets=(api_key,),
                what="services.skus.list",
                auth_hint=f"check ${GCP_KEY_ENV}",
            ).body
            page, token = parse_gcp_sku_page(body, self.name)
            skus.extend(page)
            if not token:
                return skus
        raise MalformedResponse(self.name, "nextPageToken", f"more than {GCP_MAX_PAGES} pages")

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        del start, end
        now = self.ctx.clock.now()
        try:
            rows = gcp_prices(self.fetch_skus(), keys, self.machine_types, now, self.name)
        except HeliotropeError as exc:
            return make_frame([], self.kind, now), {"*": exc}
        return make_frame(rows, self.kind, now), {}


# -- capacity errors observed by the GCP adapter ------------------------------------------


@dataclass(frozen=True, slots=True)
class CapacityObservation:
    """A launch that failed for lack of capacity (or succeeded), as the adapter saw it."""

    cloud: str
    zone: str
    instance_type: str
    time: datetime
    available: bool


CAPACITY_VALID: Final = timedelta(minutes=30)


def capacity_samples(
    observations: Sequence[CapacityObservation],
    observed_at: datetime,
    source: str = "gcp-capacity",
) -> pd.DataFrame:
    """Capacity errors (and successes) seen by a provider adapter, as spot availability
    samples (0 = none obtainable, 1 = at least one) valid for 30 minutes: append them to
    the state store or a trace so the policy sees what launches saw."""
    rows = [
        Obs(
            utc(o.time),
            spot_key(o.cloud, catalog.region_of_zone(o.cloud, o.zone), o.zone, o.instance_type),
            1.0 if o.available else 0.0,
            "instances",
            utc(o.time) + CAPACITY_VALID,
            source,
        )
        for o in observations
    ]
    return make_frame(rows, SignalKind.SPOT_AVAILABILITY, observed_at)
