"""Offers from Resource SKUs and prices from the Retail Prices API (fake, recorded shapes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests

from orchestrator.clock import FakeClock
from orchestrator.errors import PermanentError
from orchestrator.model import Market
from providers.azure import RetailPriceCatalog, parse_items
from providers.azure.prices import price_filter
from tests.providers.azure.fake_arm import FakeArm, recorded
from tests.providers.azure.support import T0, Factory

SKUS = ("GET", "Microsoft.Compute/skus/read")
PRICES = ("GET", "retail-prices")


def test_offers_are_known_gpu_sizes_the_subscription_may_deploy(make_provider: Factory) -> None:
    offers = {o.id: o for o in make_provider().offers()}
    sizes = {(o.region, o.instance_type) for o in offers.values()}
    assert sizes == {
        ("eastus", "Standard_NC24ads_A100_v4"),
        ("eastus", "Standard_NC4as_T4_v3"),
        ("swedencentral", "Standard_NC24ads_A100_v4"),  # a zone restriction only
        ("swedencentral", "Standard_ND96isr_H100_v5"),
    }  # not: ND96amsr (NotAvailableForSubscription in eastus), D4s_v5 (no GPU), a disk SKU
    a100 = offers["azure:eastus:Standard_NC24ads_A100_v4:spot"]
    assert (a100.gpu_type, a100.gpu_count, a100.market) == ("A100-80GB", 1, Market.SPOT)
    assert a100.grid_zone == "US-MIDA-PJM" and a100.pue == 1.18 and a100.power_kw > 0
    assert offers["azure:swedencentral:Standard_ND96isr_H100_v5:on_demand"].gpu_count == 8
    assert offers["azure:swedencentral:Standard_ND96isr_H100_v5:spot"].grid_zone == "SE-SE3"


def test_offers_are_cached(make_provider: Factory, arm: FakeArm) -> None:
    clock = FakeClock(T0)
    provider = make_provider(clock=clock, offers_ttl_s=60.0)
    provider.offers()
    provider.offers()
    assert len(arm.requests_for(*SKUS)) == 2  # one per region
    clock.advance(61)
    provider.offers()
    assert len(arm.requests_for(*SKUS)) == 4


def test_offers_raise_when_arm_refuses(make_provider: Factory, arm: FakeArm) -> None:
    arm.script(
        *SKUS,
        (
            403,
            recorded(
                "error_authorization_failed.json", subscription="s", resource_group="rg", name="n"
            ),
        ),
    )
    with pytest.raises(PermanentError, match="AuthorizationFailed"):
        make_provider().offers()


def test_prices_are_linux_retail_prices_per_market(make_provider: Factory, arm: FakeArm) -> None:
    quotes = make_provider().prices()
    by_id = {k: (q.usd_per_hour, q.source) for k, q in quotes.items()}
    retail = "azure-retail-prices"
    a100 = "azure:eastus:Standard_NC24ads_A100_v4"
    assert by_id[f"{a100}:on_demand"] == (3.673, retail)  # not the Windows price
    assert by_id[f"{a100}:spot"] == (0.7346, retail)  # not the Low Priority price
    assert by_id["azure:eastus:Standard_NC4as_T4_v3:spot"] == (0.0526, retail)
    assert by_id["azure:swedencentral:Standard_NC24ads_A100_v4:spot"] == (0.8081, retail)
    # no retail item for H100 in the recording: the catalog's list price, if it has one
    h100 = "azure:swedencentral:Standard_ND96isr_H100_v5:on_demand"
    assert h100 not in by_id or by_id[h100][1] == "list-price"
    calls = arm.requests_for(*PRICES)
    assert len(calls) >= 3  # eastus has more than one page (the fake pages by 2)
    assert all("Authorization" not in c.headers for c in calls)


def test_prices_fall_back_to_list_prices_when_the_api_fails(
    make_provider: Factory, arm: FakeArm
) -> None:
    clock = FakeClock(T0)
    provider = make_provider(clock=clock)
    arm.script(*PRICES, (500, {"error": {"code": "InternalError"}}))
    quotes = provider.prices()
    assert {q.source for q in quotes.values()} <= {"list-price"}
    provider.prices()  # the failure is remembered for a while
    assert len(arm.requests_for(*PRICES)) == 1
    clock.advance(601)
    assert {q.source for q in provider.prices().values()} >= {"azure-retail-prices"}


def test_a_next_page_on_another_host_is_not_followed(arm: FakeArm) -> None:
    arm.next_page_host = "http://127.0.0.2:9"
    catalog = RetailPriceCatalog(clock=FakeClock(T0), endpoint=arm.url)
    assert catalog.rates(["eastus"], ["Standard_NC24ads_A100_v4", "Standard_NC4as_T4_v3"]) is None
    assert len(arm.requests_for(*PRICES)) == 1


def test_retail_prices_are_cached_for_their_ttl(arm: FakeArm) -> None:
    clock = FakeClock(T0)
    catalog = RetailPriceCatalog(clock=clock, endpoint=arm.url, session=requests.Session())
    sizes = ["Standard_NC24ads_A100_v4", "Standard_NC4as_T4_v3"]
    rates = catalog.rates(["eastus"], sizes)
    assert rates is not None and rates.get("eastus", "standard_nc4as_t4_v3", Market.SPOT) == 0.0526
    fetched = len(arm.requests_for(*PRICES))
    clock.advance(timedelta(hours=5).total_seconds())
    assert catalog.rates(["eastus"], sizes) is rates
    assert len(arm.requests_for(*PRICES)) == fetched
    clock.advance(timedelta(hours=2).total_seconds())
    assert catalog.rates(["eastus"], sizes) == rates
    assert len(arm.requests_for(*PRICES)) == 2 * fetched


def test_parse_items_keeps_consumption_linux_hourly_usd() -> None:
    items = recorded("retail_prices.json")
    prices = parse_items(items)
    assert prices.get("eastus", "Standard_NC4as_T4_v3", Market.ON_DEMAND) == 0.526  # not DevTest
    bad = [
        dict(items[0], currencyCode="EUR"),
        dict(items[0], unitOfMeasure="1/Month"),
        dict(items[0], retailPrice=0),
    ]
    assert parse_items(bad).usd_per_hour == {}


def test_price_filter_names_region_and_sizes() -> None:
    assert price_filter("eastus", ["Standard_A", "Standard_B"]) == (
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
        "armRegionName eq 'eastus' and (armSkuName eq 'Standard_A' or armSkuName eq 'Standard_B')"
    )
