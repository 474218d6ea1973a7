"""offers(): built from EC2's describe calls (moto), spot price history and the Pricing API
(answers in their recorded shapes, which moto does not model), with catalog facts."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.catalog import GPUS, instance_power_kw, on_demand_usd_per_hour, pue
from orchestrator.clock import FakeClock
from orchestrator.errors import PermanentError
from orchestrator.model import Market, Offer
from providers.aws import AwsProvider
from providers.aws.offers import (
    SOURCE_CATALOG,
    SOURCE_PRICING,
    SOURCE_SPOT,
    gpu_of,
    on_demand_from_price_list,
)

from .conftest import T0, AwsError, Hooks, Raw, price_list_item


def oid(zone: str, instance_type: str, market: Market) -> str:
    return Offer.make_id("aws", zone, instance_type, market)


def offerings(raw: Raw, region: str, instance_type: str) -> set[str]:
    answer = raw.client("ec2", region).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [instance_type]}],
    )
    return {o["Location"] for o in answer["InstanceTypeOfferings"]}


def test_offers_come_from_the_describe_calls_and_the_catalog(
    provider: AwsProvider, raw: Raw
) -> None:
    offers = {o.id: o for o in provider.offers()}

    g5 = offers[oid("us-east-1a", "g5.xlarge", Market.SPOT)]
    assert (g5.cloud, g5.region, g5.zone, g5.instance_type) == (
        "aws",
        "us-east-1",
        "us-east-1a",
        "g5.xlarge",
    )
    assert (g5.gpu_type, g5.gpu_count) == ("A10G", 1)
    assert g5.power_kw == pytest.approx(instance_power_kw("A10G", 1))
    assert g5.pue == pue("aws")
    assert g5.grid_zone == "US-MIDA-PJM"
    p4d = offers[oid("us-west-2a", "p4d.24xlarge", Market.ON_DEMAND)]
    assert (p4d.gpu_type, p4d.gpu_count, p4d.grid_zone) == ("A100-40GB", 8, "US-NW-BPAT")

    # On-demand wherever EC2 says the type is sold; spot only where a spot price exists.
    on_demand_zones = {
        o.zone
        for o in offers.values()
        if o.instance_type == "g5.xlarge"
        and o.market is Market.ON_DEMAND
        and o.region == "us-east-1"
    }
    assert on_demand_zones == offerings(raw, "us-east-1", "g5.xlarge")
    spot = {o.id for o in offers.values() if o.market is Market.SPOT}
    assert spot == {
        oid("us-east-1a", "g5.xlarge", Market.SPOT),
        oid("us-east-1b", "g5.xlarge", Market.SPOT),
        oid("us-east-1a", "p4d.24xlarge", Market.SPOT),
        oid("us-west-2a", "p4d.24xlarge", Market.SPOT),
    }  # not us-east-1e


def test_only_whole_gpus_the_catalog_knows(provider: AwsProvider) -> None:
    offers = provider.offers()
    types = {o.instance_type for o in offers}
    assert all(o.gpu_type in GPUS and o.gpu_count >= 1 for o in offers)
    assert "g6.2xlarge" in types  # L4, from the catalog
    assert not any(t.startswith(("g6f.", "gr6f.")) for t in types)  # fractional L4
    assert not any(t.startswith("g5g.") for t in types)  # T4G: no power figure


def test_prices(provider: AwsProvider) -> None:
    book = provider.offer_book()
    prices, source = book.usd_per_hour, book.price_source

    spot = oid("us-east-1a", "g5.xlarge", Market.SPOT)
    assert prices[spot] == pytest.approx(0.4528)  # the newest record, not the older 0.6792
    assert source[spot] == SOURCE_SPOT
    assert provider.prices() == prices

    od = oid("us-east-1a", "p4d.24xlarge", Market.ON_DEMAND)
    assert (prices[od], source[od]) == (pytest.approx(21.96), SOURCE_PRICING)
    west = oid("us-west-2a", "p4d.24xlarge", Market.ON_DEMAND)  # not listed by the API
    assert (prices[west], source[west]) == (
        on_demand_usd_per_hour("aws", "p4d.24xlarge"),
        SOURCE_CATALOG,
    )
    assert oid("us-east-1a", "g6.2xlarge", Market.ON_DEMAND) not in prices  # nowhere


def test_requests_ask_for_the_right_things(provider: AwsProvider, hooks: Hooks) -> None:
    provider.offers()

    (types_call, *_) = hooks.called("ec2:DescribeInstanceTypes")
    assert types_call["Filters"] == [{"Name": "instance-type", "Values": ["p*", "g*"]}]
    offering = hooks.called("ec2:DescribeInstanceTypeOfferings")[0]
    assert offering["LocationType"] == "availability-zone"
    spot_calls = [
        c for c in hooks.called("ec2:DescribeSpotPriceHistory") if c["_region"] == "us-east-1"
    ]
    assert [c.get("NextToken") for c in spot_calls] == [None, "page-2"]  # both pages read
    assert spot_calls[0]["ProductDescriptions"] == ["Linux/UNIX"]
    assert spot_calls[0]["StartTime"] == T0  # the price in effect now, by the clock
    products = hooks.called("pricing:GetProducts")
    assert {c["_region"] for c in products} == {"us-east-1"}  # the pricing endpoint region
    p4d = [
        {f["Field"]: f["Value"] for f in c["Filters"]}
        for c in products
        if {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "p4d.24xlarge"} in c["Filters"]
    ]
    assert all(c["ServiceCode"] == "AmazonEC2" for c in products)
    assert sorted(terms.pop("regionCode") for terms in p4d) == ["us-east-1", "us-west-2"]
    assert (
        p4d[0]
        == p4d[1]
        == {
            "instanceType": "p4d.24xlarge",
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
        }
    )


def test_offers_are_cached_for_their_ttl(
    make_provider: Callable[..., AwsProvider], hooks: Hooks, clock: FakeClock
) -> None:
    provider = make_provider(offers_ttl_s=600.0)
    first = provider.offers()
    calls = len(hooks.calls)
    assert provider.offers() == first
    assert len(hooks.calls) == calls

    clock.advance(601.0)
    provider.offers()
    new = [op for op, _ in hooks.calls[calls:]]
    assert "ec2:DescribeSpotPriceHistory" in new
    assert "pricing:GetProducts" not in new  # on-demand prices keep for a day


def test_without_the_pricing_api_on_demand_comes_from_the_catalog(
    provider: AwsProvider, hooks: Hooks
) -> None:
    hooks.on("pricing:GetProducts", lambda params: AwsError("AccessDeniedException", status=400))
    book = provider.offer_book()

    od = oid("us-east-1a", "g5.xlarge", Market.ON_DEMAND)
    assert (book.usd_per_hour[od], book.price_source[od]) == (
        on_demand_usd_per_hour("aws", "g5.xlarge"),
        SOURCE_CATALOG,
    )
    assert len(hooks.called("pricing:GetProducts")) == 2  # once per region, then no more


def test_a_region_that_cannot_be_read_does_not_hide_the_others(
    provider: AwsProvider, hooks: Hooks, clock: FakeClock
) -> None:
    def west_denied(params: dict[str, Any]) -> AwsError | None:
        return (
            AwsError("UnauthorizedOperation", status=403)
            if (params["_region"] == "us-west-2")
            else None
        )

    hooks.on("ec2:DescribeInstanceTypes", west_denied)
    assert {o.region for o in provider.offers()} == {"us-east-1"}

    hooks.on("ec2:DescribeInstanceTypes", lambda params: None)
    clock.advance(3600.0)
    assert {o.region for o in provider.offers()} == {"us-east-1", "us-west-2"}


def test_no_region_readable_is_an_error(provider: AwsProvider, hooks: Hooks) -> None:
    hooks.fail("ec2:DescribeInstanceTypes", "AuthFailure", status=401)
    with pytest.raises(PermanentError, match="AuthFailure"):
        provider.offers()


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        ({"InstanceType": "p4de.24xlarge"}, ("A100-80GB", 8)),  # the catalog first
        (
            {
                "InstanceType": "p9.2xlarge",
                "GpuInfo": {
                    "Gpus": [
                        {
                            "Name": "A100",
                            "Manufacturer": "NVIDIA",
                            "Count": 2,
                            "MemoryInfo": {"SizeInMiB": 81920},
                        }
                    ]
                },
            },
            ("A100-80GB", 2),
        ),
        (
            {
                "InstanceType": "p9.xlarge",
                "GpuInfo": {
                    "Gpus": [
                        {
                            "Name": "H100",
                            "Manufacturer": "NVIDIA",
                            "Count": 1,
                            "MemoryInfo": {"SizeInMiB": 81920},
                        }
                    ]
                },
            },
            ("H100", 1),
        ),
        (
            {
                "InstanceType": "g9ad.xlarge",
                "GpuInfo": {
                    "Gpus": [
                        {
                            "Name": "Radeon Pro V520",
                            "Manufacturer": "AMD",
                            "Count": 1,
                            "MemoryInfo": {"SizeInMiB": 8192},
                        }
                    ]
                },
            },
            None,
        ),
        (
            {
                "InstanceType": "g9f.large",
                "GpuInfo": {
                    "Gpus": [
                        {
                            "Name": "L4",
                            "Manufacturer": "NVIDIA",
                            "Count": 1,
                            "GpuPartitionSize": 0.125,
                            "MemoryInfo": {"SizeInMiB": 3072},
                        }
                    ]
                },
            },
            None,
        ),
        ({"InstanceType": "m9.large"}, None),
    ],
)
def test_gpu_of(info: Any, expected: tuple[str, int] | None) -> None:
    assert gpu_of(info) == expected


def test_on_demand_price_list_parsing() -> None:
    capacity_block = json.loads(price_list_item("p5.48xlarge", "us-east-1", 31.0))
    capacity_block["product"]["attributes"]["marketoption"] = "CapacityBlock"
    items = [
        price_list_item("p5.48xlarge", "us-east-1", 55.04),
        price_list_item("p5.48xlarge", "us-east-1", 0.0),
        json.dumps(capacity_block),
        "not json",
    ]
    assert on_demand_from_price_list(items) == pytest.approx(55.04)
    assert on_demand_from_price_list([]) is None
