"""VM prices from the public Azure Retail Prices API (no credential, no permission).

`GET https://prices.azure.com/api/retail/prices?api-version=2023-01-01-preview&$filter=...`
answers pages of items such as

    {"armRegionName": "eastus", "armSkuName": "Standard_NC24ads_A100_v4",
     "skuName": "NC24ads A100 v4 Spot", "productName": "Virtual Machines NCadsA100v4 Series",
     "retailPrice": 1.47, "unitOfMeasure": "1 Hour", "type": "Consumption",
     "currencyCode": "USD", ...}

with `NextPageLink` naming the next page (null on the last). A size has up to six hourly
meters per region: Linux and Windows (`productName` ends in "Windows"), each regular, Spot
(`skuName` ends in "Spot") and Low Priority (the retired predecessor of Spot). We keep the
Linux regular price as on-demand and the Linux Spot price as spot. Reservations and savings
plans are other `type`s and are not asked for.

One query per region names the sizes we offer (`armSkuName eq ... or ...`). The result is
cached for `ttl_s`; when the API fails (5xx, a timeout, a malformed page, a `NextPageLink`
to another host) `rates()` returns None for `error_ttl_s` and callers fall back to the
catalog's list prices.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from orchestrator.clock import Clock
from orchestrator.model import Market

if TYPE_CHECKING:
    import requests

logger = logging.getLogger(__name__)

RETAIL_PRICES_ENDPOINT: Final = "https://prices.azure.com"
API_VERSION: Final = "2023-01-01-preview"
DEFAULT_TTL_S: Final = 6 * 3600.0
DEFAULT_ERROR_TTL_S: Final = 600.0
MAX_PAGES: Final = 50  # per region; a guard against a server that repeats its page link
SOURCE_RETAIL: Final = "azure-retail-prices"
SOURCE_LIST_PRICE: Final = "list-price"

PriceKey = tuple[str, str, Market]  # (region, lower-case size, market)


@dataclass(frozen=True, slots=True)
class PriceQuote:
    """The price of one offer and where it came from (`SOURCE_RETAIL` or
    `SOURCE_LIST_PRICE`; a list price for a spot offer is the on-demand one, an upper bound)."""

    usd_per_hour: float
    source: str


@dataclass(frozen=True, slots=True)
class RetailPrices:
    """USD per hour of one VM by (region, lower-case size, market)."""

    usd_per_hour: Mapping[PriceKey, float] = field(default_factory=dict)

    def get(self, region: str, size: str, market: Market) -> float | None:
        return self.usd_per_hour.get((region.lower(), size.lower(), market))


def _market(item: Mapping[str, Any]) -> Market | None:
    sku_name = str(item.get("skuName", ""))
    meter = str(item.get("meterName", ""))
    if "low priority" in sku_name.lower() or "low priority" in meter.lower():
        return None
    return Market.SPOT if sku_name.lower().endswith(" spot") else Market.ON_DEMAND


def parse_items(items: Iterable[Mapping[str, Any]]) -> RetailPrices:
    """The Linux hourly VM prices in Retail Prices items. When two items price the same
    (region, size, market), the higher is kept: an estimate of cost should not err low."""
    prices: dict[PriceKey, float] = {}
    for item in items:
        if (
            item.get("type") != "Consumption"
            or item.get("currencyCode", "USD") != "USD"
            or item.get("unitOfMeasure") != "1 Hour"
            or str(item.get("productName", "")).endswith("Windows")
            or item.get("serviceName", "Virtual Machines") != "Virtual Machines"
        ):
            continue
        market = _market(item)
        region = str(item.get("armRegionName", "")).lower()
        size = str(item.get("armSkuName", "")).lower()
        try:
            price = float(item.get("retailPrice", "nan"))
        except (TypeError, ValueError):
            continue
        if market is None or not region or not size or not price > 0:
            continue
        key = (region, size, market)
        prices[key] = max(price, prices.get(key, price))
    return RetailPrices(prices)


def price_filter(region: str, sizes: Sequence[str]) -> str:
    """The OData `$filter` for one region's hourly VM prices of `sizes`."""
    names = " or ".join(f"armSkuName eq '{s}'" for s in sizes)
    return (
        f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
        f"armRegionName eq '{region}' and ({names})"
    )


def _origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


class RetailPriceCatalog:
    """Retail prices of our sizes in our regions, cached by the injected clock."""

    def __init__(
        self,
        *,
        clock: Clock,
        endpoint: str = RETAIL_PRICES_ENDPOINT,
        ttl_s: float = DEFAULT_TTL_S,
        error_ttl_s: float = DEFAULT_ERROR_TTL_S,
        timeout_s: float = 30.0,
        session: requests.Session | None = None,
    ) -> None:
        self._clock = clock
        self._endpoint = endpoint.rstrip("/")
        self._ttl_s = ttl_s
        self._error_ttl_s = error_ttl_s
        self._timeout_s = timeout_s
        self._session = session
        self._cached: RetailPrices | None = None
        self._cached_for: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self._expires_s = float("-inf")

    def rates(self, regions: Sequence[str], sizes: Sequence[str]) -> RetailPrices | None:
        """Prices for `sizes` in `regions`, or None when the API failed (use list prices)."""
        key = (tuple(sorted(regions)), tuple(sorted(sizes)))
        now_s = self._clock.now().timestamp()
        if now_s < self._expires_s and key == self._cached_for:
            return self._cached
        self._cached = self._fetch(key[0], key[1]) if key[0] and key[1] else RetailPrices()
        self._cached_for = key
        self._expires_s = now_s + (self._ttl_s if self._cached is not None else self._error_ttl_s)
        return self._cached

    def _fetch(self, regions: Sequence[str], sizes: Sequence[str]) -> RetailPrices | None:
        import requests

        session = self._session or requests.Session()
        items: list[Mapping[str, Any]] = []
        try:
            for region in regions:
                fetched = self._fetch_region(session, region, sizes)
                if fetched is None:
                    return None
                items.extend(fetched)
        except (requests.RequestException, ValueError, AttributeError, TypeError) as exc:
            logger.warning(
                "retail prices unreachable or malformed (%s); using list prices",
                type(exc).__name__,
            )
            return None
        prices = parse_items(items)
        logger.info("retail prices: %s items, %s VM prices", len(items), len(prices.usd_per_hour))
        return prices

    def _fetch_region(
        self, session: requests.Session, region: str, sizes: Sequence[str]
    ) -> list[Mapping[str, Any]] | None:
        url: str | None = f"{self._endpoint}/api/retail/prices"
        params: dict[str, str] | None = {
            "api-version": API_VERSION,
            "$filter": price_filter(region, sizes),
        }
        items: list[Mapping[str, Any]] = []
        for _ in range(MAX_PAGES):
            assert url is not None
            response = session.get(
                url, params=params, headers={"Accept": "application/json"}, timeout=self._timeout_s
            )
            if response.status_code != 200:
                logger.warning(
                    "retail prices answered HTTP %s for %s; using list prices",
                    response.status_code,
                    region,
                )
                return None
            page = response.json()
            items.extend(page.get("Items") or [])
            url = page.get("NextPageLink") or None
            if url is None:
                return items
            if _origin(url) != _origin(self._endpoint):
                logger.warning("retail prices: next page on another host; using list prices")
                return None
            params = None  # the link carries the query
        logger.warning(
            "retail prices: more than %s pages for %s; using list prices", MAX_PAGES, region
        )
        return None
