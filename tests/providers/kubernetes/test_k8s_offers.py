"""Offers, prices and capacity from nodes (fake API server, NodeList shapes)."""

from __future__ import annotations

import pytest

from orchestrator import catalog
from orchestrator.errors import PermanentError
from orchestrator.model import Market
from providers.base import Capability
from providers.kubernetes import KubeLaunchConfig, KubeRegion
from tests.providers.kubernetes.fake_kube import FakeKube, recorded
from tests.providers.kubernetes.support import A100X1, A100X8, H100X8_OD, H100X8_SPOT, Factory, spec


def test_offers_are_gpu_pools_by_type_and_market(make_provider: Factory) -> None:
    offers = {o.id: o for o in make_provider().offers()}
    assert set(offers) == {
        *(f"k8s:onprem:a100-80gbx{n}:on_demand" for n in (1, 2, 4, 8)),
        *(f"k8s:gpucloud:h100x{n}:{m}" for n in (1, 2, 4, 8) for m in ("spot", "on_demand")),
    }  # not: the L4 node (not ready), the CPU node, the GPU the catalog does not know
    h100 = offers[H100X8_SPOT]
    assert (h100.gpu_type, h100.gpu_count, h100.market, h100.region) == (
        "H100",
        8,
        Market.SPOT,
        "gpucloud",
    )
    assert h100.grid_zone == "US-MIDA-PJM" and h100.pue == 1.25
    assert h100.power_kw == catalog.instance_power_kw("H100", 8)
    assert offers[A100X8].pue == catalog.pue("local") and offers[A100X8].grid_zone == "DE"


def test_prices_are_per_gpu_hour_from_the_config(make_provider: Factory) -> None:
    prices = make_provider().prices()
    assert prices[A100X8] == pytest.approx(8 * 1.10)
    assert prices[A100X1] == pytest.approx(1.10)
    assert prices[H100X8_OD] == pytest.approx(8 * 2.49)
    assert prices[H100X8_SPOT] == pytest.approx(8 * 1.25)


def test_capacity_counts_free_gpus_on_ready_schedulable_nodes(make_provider: Factory) -> None:
    provider = make_provider()
    provider.offers()
    capacity = provider.capacity()
    # two ready A100 nodes of 8 (the third is cordoned), two spot H100 nodes, one on-demand
    assert capacity[A100X8] == 2 and capacity[A100X1] == 16
    assert capacity[H100X8_SPOT] == 2 and capacity[H100X8_OD] == 1
    assert provider.launch(spec(A100X8), request_id="a").ok
    provider.offers()
    assert provider.capacity()[A100X8] == 1 and provider.capacity()[A100X1] == 8


def test_a_pool_the_gang_does_not_fit_is_refused_before_anything_is_made(
    make_provider: Factory, onprem: FakeKube
) -> None:
    out = make_provider().launch(spec(A100X8, count=3), request_id="big")
    assert out.error is not None and out.error.kind.value == "capacity"
    assert "room for 2 pod(s)" in out.error.message
    assert not onprem.requests_for("pods", "create")


def test_spot_needs_spot_labels(make_provider: Factory) -> None:
    provider = make_provider(launch_config=KubeLaunchConfig(spot_labels={}))
    assert Capability.SPOT not in provider.capabilities()
    assert not [o for o in provider.offers() if o.market is Market.SPOT]


def test_node_listing_errors_raise(make_provider: Factory, gpucloud: FakeKube) -> None:
    gpucloud.script("GET", "nodes", "list", (403, recorded("status_403_rbac.json")))
    with pytest.raises(PermanentError, match="Forbidden"):
        make_provider().offers()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cluster": ""}, "cluster"),
        ({"regions": ()}, "regions"),
        ({"regions": (KubeRegion("a"), KubeRegion("a"))}, "regions"),
        ({"regions": (KubeRegion("a", namespace=""),)}, "regions[a].namespace"),
        ({"regions": (KubeRegion("a", usd_per_gpu_hour={"H100": -1.0}),)}, "regions[a] prices"),
    ],
)
def test_bad_settings_name_the_field(
    make_provider: Factory, overrides: dict[str, object], field: str
) -> None:
    from orchestrator.errors import InputError

    with pytest.raises(InputError) as raised:
        make_provider(**overrides)
    assert raised.value.field == field


def test_without_a_configured_price_the_node_label_prices_the_pool(make_provider: Factory) -> None:
    """The recorded A100 nodes carry heliotrope.io/usd-per-gpu-hour 0.95 and 1.05."""
    unpriced = KubeRegion("onprem", grid_zone="DE")
    prices = make_provider(regions=(unpriced,)).prices()
    assert prices[A100X8] == pytest.approx(8 * 1.05)  # the highest, not the cheapest
    assert make_provider().prices()[A100X8] == pytest.approx(8 * 1.10)  # the config wins
