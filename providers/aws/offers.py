"""What AWS sells: one offer per (zone, GPU instance type, market), and its price.

Per region:
- GPU instance types: `DescribeInstanceTypes` (P and G families, paginated), the ones
  with `GpuInfo`;
- where each is sold: `DescribeInstanceTypeOfferings(LocationType="availability-zone")`;
- spot prices: `DescribeSpotPriceHistory` from now, Linux/UNIX; the newest record per
  (zone, type) is the price in effect. A spot offer exists only where a spot price does;
- on-demand prices: the Pricing API `GetProducts` (Linux, shared tenancy, no
  pre-installed software, capacity status Used), the catalog's list price as a fallback.

The rest of an `Offer` comes from the catalog: GPU type and count (`instance_gpus`, else
`GpuInfo`), power under load, the cloud's PUE and the region's grid zone. Instance types
whose GPU the catalog does not know (no power figure) are left out, as are fractional GPUs.
The fetch functions take a client and an `EdgeRetry`; the parsing functions are pure.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, cast

from orchestrator.catalog import (
    canonical_gpu_name,
    grid_zone,
    instance_gpus,
    instance_power_kw,
    pue,
)
from orchestrator.model import Market, Offer, OfferId
from providers.aws.errors import EdgeRetry
from providers.aws.instances import CLOUD

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import FilterTypeDef, InstanceTypeInfoTypeDef, SpotPriceTypeDef
    from mypy_boto3_pricing import PricingClient
    from mypy_boto3_pricing.type_defs import FilterTypeDef as PricingFilterTypeDef

logger = logging.getLogger(__name__)

UNKNOWN_GRID_ZONE: Final = "unknown"  # as orchestrator.signals.grid names a zone it cannot find
SPOT_PRODUCT: Final = "Linux/UNIX"
# EC2's NVIDIA GPU instances are the P and G families (P2-P6, G4dn-G6e, Gr6); asking for
# them only keeps DescribeInstanceTypes to one or two pages instead of fifteen.
GPU_FAMILIES: Final = ("p*", "g*")
FILTER_CHUNK: Final = 100  # values per request filter / instance-type list
SOURCE_SPOT: Final = "ec2:DescribeSpotPriceHistory"
SOURCE_PRICING: Final = "pricing:GetProducts"
SOURCE_CATALOG: Final = "catalog"
_MIB_PER_GB: Final = 1024


@dataclass(frozen=True, slots=True)
class PricedOffer:
    offer: Offer
    usd_per_hour: float  # NaN when no price is known
    price_source: str  # SOURCE_*, "" when no price is known


@dataclass(frozen=True, slots=True)
class OfferBook:
    """Offers of all regions at `fetched_at_s`, with their prices ($/h, whole instance)."""

    offers: tuple[Offer, ...]
    usd_per_hour: Mapping[OfferId, float]
    price_source: Mapping[OfferId, str]
    fetched_at_s: float

    @staticmethod
    def of(priced: Iterable[PricedOffer], fetched_at_s: float) -> OfferBook:
        items = sorted(priced, key=lambda p: p.offer.id)
        return OfferBook(
            offers=tuple(p.offer for p in items),
            usd_per_hour={
                p.offer.id: p.usd_per_hour for p in items if not math.isnan(p.usd_per_hour)
            },
            price_source={p.offer.id: p.price_source for p in items if p.price_source},
            fetched_at_s=fetched_at_s,
        )


# -- parsing (pure) -----------------------------------------------------------------------


def gpu_of(info: InstanceTypeInfoTypeDef) -> tuple[str, int] | None:
    """(canonical GPU type, count) of an instance type: the catalog first, else its
    GpuInfo (name and per-GPU memory, so "A100" with 80 GB is an A100-80GB); None for
    no GPU, a fraction of one, or a GPU the catalog has no power figure for."""
    instance_type = info.get("InstanceType", "")
    known = instance_gpus(CLOUD, instance_type)
    if known is not None:
        return known
    devices = info.get("GpuInfo", {}).get("Gpus", [])
    if not devices:
        return None
    names: set[str] = set()
    count = 0
    for device in devices:
        if device.get("GpuPartitionSize", 1.0) < 1.0:
            return None
        name = device.get("Name", "")
        memory_gb = round(device.get("MemoryInfo", {}).get("SizeInMiB", 0) / _MIB_PER_GB)
        canonical = canonical_gpu_name(f"{name}-{memory_gb}gb") or canonical_gpu_name(name)
        if canonical is None:
            return None
        names.add(canonical)
        count += device.get("Count", 0)
    if len(names) != 1 or count < 1:
        return None
    return names.pop(), count


def latest_spot_prices(records: Iterable[SpotPriceTypeDef]) -> dict[tuple[str, str], float]:
    """The newest price per (zone, instance type)."""
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for record in records:
        zone = record.get("AvailabilityZone", "")
        instance_type = record.get("InstanceType", "")
        when = record.get("Timestamp")
        try:
            price = float(record.get("SpotPrice", "nan"))
        except ValueError:
            continue
        if not zone or not instance_type or when is None or not price > 0:
            continue
        key = (zone, instance_type)
        if key not in newest or when > newest[key][0]:
            newest[key] = (when, price)
    return {key: price for key, (_, price) in newest.items()}


def on_demand_from_price_list(price_list: Iterable[str]) -> float | None:
    """The hourly on-demand price in a `GetProducts` price list (JSON strings, format
    aws_v1): the lowest positive USD-per-hour dimension of an on-demand product."""
    best: float | None = None
    for item in price_list:
        try:
            product = json.loads(item)
        except json.JSONDecodeError:
            continue
        attributes = product.get("product", {}).get("attributes", {})
        if attributes.get("marketoption", "OnDemand") != "OnDemand":
            continue  # capacity blocks and the like
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                if str(dimension.get("unit", "")).lower() not in ("hrs", "hours", "hour"):
                    continue
                try:
                    usd = float(dimension.get("pricePerUnit", {}).get("USD", "nan"))
                except (TypeError, ValueError):
                    continue
                if usd > 0 and (best is None or usd < best):
                    best = usd
    return best


def region_offers(
    region: str,
    gpus: Mapping[str, tuple[str, int]],
    zones: Mapping[str, Sequence[str]],
    spot_usd_per_hour: Mapping[tuple[str, str], float],
    on_demand: Mapping[str, tuple[float, str]],
) -> list[PricedOffer]:
    """Offers of one region: on-demand in every zone that sells the type, spot where a
    spot price exists. `on_demand[type]` is (price, source); missing means unknown."""
    cloud_pue = pue(CLOUD)
    grid = grid_zone(CLOUD, region) or UNKNOWN_GRID_ZONE
    out: list[PricedOffer] = []
    for instance_type, (gpu_type, gpu_count) in sorted(gpus.items()):
        power_kw = instance_power_kw(gpu_type, gpu_count)
        for zone in sorted(zones.get(instance_type, ())):

            def offer(
                market: Market,
                zone: str = zone,
                it: str = instance_type,
                g: str = gpu_type,
                n: int = gpu_count,
                kw: float = power_kw,
            ) -> Offer:
                return Offer(
                    id=Offer.make_id(CLOUD, zone, it, market),
                    cloud=CLOUD,
                    region=region,
                    zone=zone,
                    instance_type=it,
                    gpu_type=g,
                    gpu_count=n,
                    market=market,
                    grid_zone=grid,
                    power_kw=kw,
                    pue=cloud_pue,
                )

            usd, source = on_demand.get(instance_type, (math.nan, ""))
            out.append(PricedOffer(offer(Market.ON_DEMAND), usd, source))
            spot = spot_usd_per_hour.get((zone, instance_type))
            if spot is not None:
                out.append(PricedOffer(offer(Market.SPOT), spot, SOURCE_SPOT))
    return out


# -- fetching -----------------------------------------------------------------------------


def _chunks(values: Sequence[str], size: int = FILTER_CHUNK) -> Iterable[list[str]]:
    for start in range(0, len(values), size):
        yield list(values[start : start + size])


def fetch_gpu_types(ec2: EC2Client, retry: EdgeRetry, region: str) -> dict[str, tuple[str, int]]:
    """GPU instance types of a region: {type: (gpu type, count)}."""
    paginator = ec2.get_paginator("describe_instance_types")
    filters: list[FilterTypeDef] = [{"Name": "instance-type", "Values": list(GPU_FAMILIES)}]
    pages = retry(
        lambda: list(paginator.paginate(Filters=filters)), f"ec2:DescribeInstanceTypes {region}"
    )
    found: dict[str, tuple[str, int]] = {}
    skipped: list[str] = []
    for page in pages:
        for info in page.get("InstanceTypes", []):
            if "GpuInfo" not in info:
                continue
            gpu = gpu_of(info)
            if gpu is None:
                skipped.append(info.get("InstanceType", "?"))
                continue
            found[info.get("InstanceType", "")] = gpu
    if skipped:
        logger.debug(
            "%s: GPU instance types without a catalog GPU, left out: %s",
            region,
            ", ".join(sorted(skipped)),
        )
    return found


def fetch_zones(
    ec2: EC2Client, retry: EdgeRetry, region: str, instance_types: Sequence[str]
) -> dict[str, list[str]]:
    """{type: zones that sell it} for the given types."""
    paginator = ec2.get_paginator("describe_instance_type_offerings")
    zones: dict[str, list[str]] = {}
    for chunk in _chunks(sorted(instance_types)):
        filters: list[FilterTypeDef] = [{"Name": "instance-type", "Values": chunk}]
        pages = retry(
            lambda filters=filters: list(  # type: ignore[misc]
                paginator.paginate(LocationType="availability-zone", Filters=filters)
            ),
            f"ec2:DescribeInstanceTypeOfferings {region}",
        )
        for page in pages:
            for item in page.get("InstanceTypeOfferings", []):
                zone = item.get("Location", "")
                instance_type = item.get("InstanceType", "")
                if zone and instance_type:
                    zones.setdefault(instance_type, []).append(zone)
    return zones


def spot_price_pages(
    ec2: EC2Client,
    call: Callable[[Callable[[], list[Any]], str], list[Any]],
    region: str,
    instance_types: Sequence[str],
    start: datetime,
    end: datetime | None = None,
) -> list[Any]:
    """Every `DescribeSpotPriceHistory` page (Linux/UNIX) of `instance_types` in `region`
    from `start` (to `end`; None: now), `FILTER_CHUNK` types a request, each request made
    through `call(fetch, action)` (the caller's retry and error mapping). The one reader of
    AWS spot prices: the adapter's offers keep the newest price per key
    (`fetch_spot_prices`), the signals source the history
    (orchestrator/signals/sources/clouds.py)."""
    paginator = ec2.get_paginator("describe_spot_price_history")
    window: dict[str, datetime] = {"StartTime": start}
    if end is not None:
        window["EndTime"] = end
    pages: list[Any] = []
    for chunk in _chunks(instance_types):
        types = cast("list[InstanceTypeType]", chunk)

        def fetch(types: list[InstanceTypeType] = types) -> list[Any]:
            return list(
                paginator.paginate(
                    InstanceTypes=types,
                    ProductDescriptions=[SPOT_PRODUCT],
                    **window,  # type: ignore[arg-type]
                )
            )

        pages.extend(call(fetch, f"ec2:DescribeSpotPriceHistory {region}"))
    return pages


def fetch_spot_prices(
    ec2: EC2Client, retry: EdgeRetry, region: str, instance_types: Sequence[str], now: datetime
) -> dict[tuple[str, str], float]:
    """{(zone, type): spot $/h in effect at `now`}."""
    pages = spot_price_pages(ec2, retry, region, sorted(instance_types), now)
    records: list[SpotPriceTypeDef] = [
        r for page in pages for r in page.get("SpotPriceHistory", [])
    ]
    return latest_spot_prices(records)


def pricing_filters(region: str, instance_type: str) -> list[PricingFilterTypeDef]:
    terms = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [
        {"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in terms.items()
    ]


def fetch_on_demand(
    pricing: PricingClient, retry: EdgeRetry, region: str, instance_type: str
) -> float | None:
    """On-demand $/h of a type in a region from the Pricing API, None when not listed."""
    paginator = pricing.get_paginator("get_products")
    filters = pricing_filters(region, instance_type)
    pages: list[Any] = retry(
        lambda: list(
            paginator.paginate(ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1")
        ),
        f"pricing:GetProducts {region} {instance_type}",
    )
    items: list[str] = []
    for page in pages:
        items.extend(str(p) for p in page.get("PriceList", []))
    return on_demand_from_price_list(items)
