"""`heliotrope offers`: the configured clouds' priced offers as a table, cheapest per
GPU-hour first, each with its grid's carbon (`CarbonIndex`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator import catalog
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import InputError
from orchestrator.live.clouds.adapters import make_providers
from orchestrator.live.clouds.carbon import CarbonIndex, carbon_sources
from orchestrator.live.clouds.settings import CloudSettings
from orchestrator.model import Market, Offer, OfferId
from providers.base import Quote
from providers.multi import MultiProvider
from providers.registry import CloudAccess


def gpu_matches(gpu_type: str, wanted: str) -> bool:
    """`--gpu A100` matches A100-40GB and A100-80GB; `--gpu A100-80GB` only that one."""
    w = wanted.strip().upper()
    g = gpu_type.upper()
    return g == w or g.split("-", 1)[0] == w or catalog.canonical_gpu_name(wanted) == gpu_type


def offer_rows(
    offers: Iterable[Offer],
    quotes: Mapping[OfferId, Quote],
    carbon: CarbonIndex,
    now_s: float,
    *,
    gpu: str | None = None,
    market: Market | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Priced offers as table rows, cheapest per GPU-hour first; and how many matching
    offers have no known price (left out)."""
    rows: list[tuple[float, str, dict[str, Any]]] = []
    unpriced = 0
    for o in offers:
        if gpu and not gpu_matches(o.gpu_type, gpu):
            continue
        if market is not None and o.market is not market:
            continue
        quote = quotes.get(o.id)
        if quote is None:
            unpriced += 1
            continue
        per_gpu = quote.usd_per_hour / max(o.gpu_count, 1)
        reading = carbon.at(o.grid_zone, now_s)
        rows.append(
            (
                per_gpu,
                o.id,
                {
                    "cloud": o.cloud,
                    "region": o.region,
                    "zone": o.zone,
                    "instance_type": o.instance_type,
                    "gpu": o.gpu_type,
                    "gpus": o.gpu_count,
                    "market": o.market.value,
                    "usd_per_gpu_hour": round(per_gpu, 4),
                    "usd_per_hour": round(quote.usd_per_hour, 4),
                    "price_source": quote.source,
                    "grid_zone": o.grid_zone,
                    "g_co2_per_kwh": round(reading.g_per_kwh, 1),
                    "carbon_source": reading.source,
                },
            )
        )
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in rows], unpriced


def compact_offer_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """`offer_rows` for a terminal: fewer, narrower columns."""
    return [
        {
            "where": f"{r['cloud']}:{r['zone']}",
            "instance": r["instance_type"],
            "gpus": f"{r['gpus']} x {r['gpu']}",
            "market": r["market"],
            "$/GPU-h": f"{r['usd_per_gpu_hour']:.3f}",
            "$/h": f"{r['usd_per_hour']:.3f}",
            "price from": r["price_source"],
            "gCO2/kWh": f"{r['g_co2_per_kwh']:.0f} {r['grid_zone']}",
            "carbon from": r["carbon_source"],
        }
        for r in rows
    ]


def parse_market(text: str | None) -> Market | None:
    if not text:
        return None
    try:
        return Market(text.strip().lower().replace("-", "_"))
    except ValueError:
        raise InputError("", "--market", "spot or on_demand", got=repr(text)) from None


def offers_table(
    settings: CloudSettings,
    *,
    clouds: Sequence[str] | None = None,
    gpu: str | None = None,
    market: Market | None = None,
    traces: Path | None = None,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> tuple[list[dict[str, Any]], int]:
    if (
        gpu
        and catalog.canonical_gpu_name(gpu) is None
        and not any(g.split("-", 1)[0] == gpu.strip().upper() for g in catalog.GPUS)
    ):
        raise InputError(
            "", "--gpu", "a GPU type: " + ", ".join(sorted(catalog.GPUS)), got=repr(gpu)
        )
    clock = clock or SystemClock()
    providers = make_providers(settings, clock=clock, access=access, clouds=clouds)
    multi = MultiProvider(list(providers.values()))
    offers = multi.offers()
    quotes = multi.quotes()
    trace, store = carbon_sources(settings, traces)
    now_s = clock.now().timestamp()
    carbon = CarbonIndex.build({o.grid_zone for o in offers}, trace=trace, store=store, now_s=now_s)
    return offer_rows(offers, quotes, carbon, now_s, gpu=gpu, market=market)
