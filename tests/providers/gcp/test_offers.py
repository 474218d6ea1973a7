"""offers() from machineTypes.list; prices() from the Cloud Billing Catalog, with fallback."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from orchestrator import catalog
from orchestrator.clock import FakeClock
from orchestrator.errors import PermanentError
from orchestrator.model import Market
from providers.gcp import parse_skus
from providers.gcp.billing import SOURCE_BILLING, SOURCE_LIST_PRICE

from .conftest import T0, ZONES, Factory
from .fake_compute import FakeCompute, recorded

SKUS = "cloudbilling.services.skus.list"
KEY = "test-billing-key"


def test_offers_are_gpu_machine_types_on_both_markets(
    make_provider: Factory, compute: FakeCompute
) -> None:
    offers = make_provider().offers()
    types = {(o.zone, o.instance_type) for o in offers}
    assert types == {
        ("us-central1-a", "a2-highgpu-1g"),
        ("us-central1-a", "a2-ultragpu-8g"),
        ("us-central1-a", "a3-highgpu-8g"),
        ("us-central1-a", "g2-standard-4"),
        ("us-central1-a", "g2-standard-48"),
        ("europe-west4-a", "a2-highgpu-1g"),
        ("europe-west4-a", "g2-standard-4"),
    }  # no CPU-only n1, no deprecated a2-highgpu-2g
    assert len(offers) == 2 * len(types)
    by_id = {o.id: o for o in offers}
    h100 = by_id["gcp:us-central1-a:a3-highgpu-8g:spot"]
    assert (h100.gpu_type, h100.gpu_count, h100.market) == ("H100", 8, Market.SPOT)
    assert h100.region == "us-central1" and h100.grid_zone == "US-MIDW-MISO"
    assert h100.power_kw == pytest.approx(catalog.instance_power_kw("H100", 8))
    assert h100.pue == catalog.pue("gcp")
    assert by_id["gcp:europe-west4-a:g2-standard-4:on_demand"].grid_zone == catalog.grid_zone(
        "gcp", "europe-west4"
    )
    lists = compute.requests_for("compute.machineTypes.list")
    assert [c.path.split("/")[-2] for c in lists] == list(ZONES)
    assert all(c.query["filter"] == ['name eq "(a2|a3|g2)-.*"'] for c in lists)


def test_offers_are_cached(make_provider: Factory, compute: FakeCompute) -> None:
    clock = FakeClock(T0)
    provider = make_provider(clock=clock)
    first = provider.offers()
    assert provider.offers() == first
    assert len(compute.requests_for("compute.machineTypes.list")) == len(ZONES)
    clock.advance(3601)
    provider.offers()
    assert len(compute.requests_for("compute.machineTypes.list")) == 2 * len(ZONES)


def test_offers_survive_filters_being_ignored(make_provider: Factory, compute: FakeCompute) -> None:
    compute.honour_filters = False  # the n1 and the deprecated a2 come back too
    types = {o.instance_type for o in make_provider().offers()}
    assert "n1-standard-8" not in types and "a2-highgpu-2g" not in types


def test_sku_pages_are_parsed_into_part_rates() -> None:
    pages = [recorded("billing_skus_page1.json"), recorded("billing_skus_page2.json")]
    rates = parse_skus([s for page in pages for s in page["skus"]])
    assert rates.get("gpu", "A100", Market.ON_DEMAND, "us-central1") == pytest.approx(2.933908)
    assert rates.get("gpu", "A100", Market.SPOT, "us-central1") == pytest.approx(0.88)
    assert rates.get("core", "A2", Market.SPOT, "us-west1") == pytest.approx(0.00948)
    assert rates.get("ram", "G2", Market.ON_DEMAND, "us-central1") == pytest.approx(0.002927)
    assert rates.get("gpu", "H100 80GB", Market.ON_DEMAND, "us-central1") == pytest.approx(9.33225)
    assert rates.get("ram", "G2", Market.ON_DEMAND, "europe-west4") is None  # not in the pages
    # commitments, DWS and licences are not machine rates
    assert 0.019915 not in rates.usd_per_unit_hour.values()
    assert 0.01 not in rates.usd_per_unit_hour.values()
    assert all(k[0] in {"gpu", "core", "ram"} for k in rates.usd_per_unit_hour)


def test_prices_come_from_the_billing_catalog_paginated(
    make_provider: Factory, compute: FakeCompute, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    quotes = make_provider(billing_api_key=KEY).prices()

    pages = compute.requests_for(SKUS)
    assert [c.query.get("pageToken") for c in pages] == [None, ["page-2"]]
    for call in pages:
        assert call.path == "/v1/services/6F81-5844-456A/skus"
        assert {k.lower(): v for k, v in call.headers.items()}["x-goog-api-key"] == KEY
        assert "key" not in call.query  # the key never appears in a URL
    od = quotes["gcp:us-central1-a:a2-highgpu-1g:on_demand"]
    # 1 A100 + 12 vCPUs + 85 GiB, which is the pricing page's a2-highgpu-1g price
    assert od.source == SOURCE_BILLING
    assert od.usd_per_hour == pytest.approx(2.933908 + 12 * 0.031611 + 85 * 0.004237)
    assert od.usd_per_hour == pytest.approx(catalog.on_demand_usd_per_hour("gcp", "a2-highgpu-1g"))
    spot = quotes["gcp:us-central1-a:a2-highgpu-1g:spot"]
    assert spot.source == SOURCE_BILLING
    assert spot.usd_per_hour == pytest.approx(0.88 + 12 * 0.00948 + 85 * 0.00127)
    h100 = quotes["gcp:us-central1-a:a3-highgpu-8g:spot"]
    assert h100.usd_per_hour == pytest.approx(8 * 2.25 + 208 * 0.0125 + 1872 * 0.00125)
    # europe-west4 has no G2 RAM SKU in the pages: the list price stands in
    eu_l4 = quotes["gcp:europe-west4-a:g2-standard-4:on_demand"]
    assert eu_l4 == type(eu_l4)(
        catalog.on_demand_usd_per_hour("gcp", "g2-standard-4") or 0.0, SOURCE_LIST_PRICE
    )
    assert KEY not in caplog.text


def test_prices_are_cached_for_the_ttl(make_provider: Factory, compute: FakeCompute) -> None:
    clock = FakeClock(T0)
    provider = make_provider(
        billing_api_key=KEY, clock=clock, billing_ttl_s=3600, offers_ttl_s=10 * 3600
    )
    provider.prices()
    provider.prices()
    assert len(compute.requests_for(SKUS)) == 2  # two pages, once
    clock.advance(3601)
    provider.prices()
    assert len(compute.requests_for(SKUS)) == 4


def test_a_refusing_billing_api_falls_back_to_list_prices(
    make_provider: Factory, compute: FakeCompute, caplog: pytest.LogCaptureFixture
) -> None:
    compute.billing_forbidden = True
    clock = FakeClock(T0)
    provider = make_provider(billing_api_key=KEY, clock=clock)
    quotes = provider.prices()

    assert len(compute.requests_for(SKUS)) == 1
    assert {q.source for q in quotes.values()} == {SOURCE_LIST_PRICE}
    for offer_id, quote in quotes.items():
        machine = offer_id.split(":")[2]
        assert quote.usd_per_hour == catalog.on_demand_usd_per_hour("gcp", machine)
    assert set(quotes) == {o.id for o in provider.offers()}
    assert "HTTP 403" in caplog.text and KEY not in caplog.text
    provider.prices()  # the failure is remembered for a while: no hammering
    assert len(compute.requests_for(SKUS)) == 1
    clock.advance(timedelta(minutes=11).total_seconds())
    compute.billing_forbidden = False
    assert {q.source for q in provider.prices().values()} == {SOURCE_BILLING, SOURCE_LIST_PRICE}


def test_without_a_key_the_billing_api_is_not_called(
    make_provider: Factory, compute: FakeCompute
) -> None:
    quotes = make_provider(billing_api_key=None).prices()
    assert compute.requests_for(SKUS) == []
    assert quotes and {q.source for q in quotes.values()} == {SOURCE_LIST_PRICE}
    assert "gcp:us-central1-a:g2-standard-48:spot" in quotes  # spot: on-demand, an upper bound


def test_a_failing_machine_type_listing_raises_a_heliotrope_error(
    make_provider: Factory, compute: FakeCompute
) -> None:
    denied = recorded("error_403_permission_denied.json", project="p", zone="z", instance="x")
    compute.script("compute.machineTypes.list", (403, denied))
    with pytest.raises(PermanentError, match="auth"):
        make_provider().offers()
