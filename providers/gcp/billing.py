"""GPU machine prices from the Cloud Billing Catalog API, with list prices as the fallback.

Compute Engine bills an accelerator-optimized machine by its parts: GPUs, vCPUs and memory,
each a SKU of the Compute Engine service (`services/6F81-5844-456A`) with one price per
region and usage type (`OnDemand`, or `Preemptible` for Spot VMs). The SKU descriptions
read, for example:

    Nvidia Tesla A100 GPU running in Americas                (resourceGroup GPU, "h")
    Spot Preemptible Nvidia L4 GPU running in Americas
    A2 Instance Core running in Americas                     (resourceGroup CPU, "h")
    Spot Preemptible G2 Instance Ram running in Americas     (resourceGroup RAM, "GiBy.h")

so the price of a machine type in a region is
`gpus x GPU rate + vCPUs x core rate + GiB x RAM rate`, with vCPUs and memory from
`machineTypes.list`. A machine type whose three SKUs are not all found gets no catalog
price. Commitment, reservation, DWS and sole-tenancy SKUs are ignored.

The catalog is read with an API key (`X-Goog-Api-Key` header, so the key is never part of
a URL or a log line), one page at a time following `nextPageToken`, and cached for
`ttl_s`. When there is no key or the API fails (403, 5xx, a timeout, a malformed page),
`rates()` returns None for `error_ttl_s` and callers fall back to the catalog's list prices.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from orchestrator.clock import Clock
from orchestrator.model import Market

if TYPE_CHECKING:
    import requests

logger = logging.getLogger(__name__)

COMPUTE_SERVICE_ID: Final = "6F81-5844-456A"  # Compute Engine in the Cloud Billing Catalog
BILLING_ENDPOINT: Final = "https://cloudbilling.googleapis.com"
DEFAULT_TTL_S: Final = 6 * 3600.0  # SKU prices change at most a few times a month
DEFAULT_ERROR_TTL_S: Final = 600.0  # after a failure, list prices for this long
PAGE_SIZE: Final = 5000
MAX_PAGES: Final = 200  # a guard against a server that repeats its page token

SOURCE_BILLING: Final = "billing-catalog"
SOURCE_LIST_PRICE: Final = "list-price"

# Machine series -> (GPU name in the SKU description, machine family in the SKU description).
# From the Compute Engine SKU descriptions of the Cloud Billing Catalog (service
# 6F81-5844-456A) and the "GPU machine types" pricing page, which prices A2, A3 and G2 by
# GPU, vCPU and memory.
SERIES_SKUS: Final[Mapping[str, tuple[str, str]]] = {
    "a2-highgpu": ("A100", "A2"),
    "a2-megagpu": ("A100", "A2"),
    "a2-ultragpu": ("A100 80GB", "A2"),
    "a3-highgpu": ("H100 80GB", "A3"),
    "a3-edgegpu": ("H100 80GB", "A3"),
    "a3-megagpu": ("H100 80GB Mega", "A3 Mega"),
    "g2-standard": ("L4", "G2"),
}

_GPU_SKU = re.compile(
    r"^(?:Spot )?(?:Preemptible )?Nvidia (?:Tesla )?(?P<name>.+?) GPU running in .+$",
    re.IGNORECASE,
)
_HOST_SKU = re.compile(
    r"^(?:Spot )?(?:Preemptible )?(?P<family>[A-Z]\d+(?: [A-Za-z]+)?) Instance "
    r"(?P<part>Core|Ram) running in .+$",
    re.IGNORECASE,
)
_IGNORED = re.compile(r"commit|reserv|dws|calendar|flex|sole tenan|custom|extended", re.I)
_MARKETS: Final[Mapping[str, Market]] = {"OnDemand": Market.ON_DEMAND, "Preemptible": Market.SPOT}
_UNITS: Final[Mapping[str, str]] = {"gpu": "h", "core": "h", "ram": "GiBy.h"}

RateKey = tuple[str, str, Market, str]  # (part: gpu|core|ram, name, market, region)


@dataclass(frozen=True, slots=True)
class PriceQuote:
    """The price of one offer and where it came from (`SOURCE_BILLING` or
    `SOURCE_LIST_PRICE`; a list price for a spot offer is the on-demand list price, an
    upper bound)."""

    usd_per_hour: float
    source: str


@dataclass(frozen=True, slots=True)
class ComputeRates:
    """USD per hour of one GPU, one vCPU or one GiB of memory, by (part, name, market,
    region); names are lower case ("a100 80gb", "a2")."""

    usd_per_unit_hour: Mapping[RateKey, float] = field(default_factory=dict)

    def get(self, part: str, name: str, market: Market, region: str) -> float | None:
        return self.usd_per_unit_hour.get((part, name.lower(), market, region))

    def machine_usd_per_hour(
        self,
        machine_type: str,
        region: str,
        market: Market,
        *,
        gpu_count: int,
        vcpus: int,
        memory_gib: float,
    ) -> float | None:
        """The price of one machine, or None when a part's SKU is missing."""
        series = machine_type.lower().rsplit("-", 1)[0]
        names = SERIES_SKUS.get(series)
        if names is None:
            return None
        gpu_rate = self.get("gpu", names[0], market, region)
        core_rate = self.get("core", names[1], market, region)
        ram_rate = self.get("ram", names[1], market, region)
        if gpu_rate is None or core_rate is None or ram_rate is None:
            return None
        return gpu_count * gpu_rate + vcpus * core_rate + memory_gib * ram_rate


def _unit_price_usd(sku: Mapping[str, Any], unit: str) -> float | None:
    infos = sku.get("pricingInfo") or []
    if not infos:
        return None
    expression = infos[0].get("pricingExpression") or {}
    if expression.get("usageUnit") != unit:
        return None
    tiers = expression.get("tieredRates") or []
    if not tiers:
        return None
    tier = max(tiers, key=lambda t: float(t.get("startUsageAmount") or 0.0))  # the marginal rate
    price = tier.get("unitPrice") or {}
    if price.get("currencyCode", "USD") != "USD":
        return None
    return int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9


def _sku_key(sku: Mapping[str, Any]) -> tuple[str, str, Market] | None:
    category = sku.get("category") or {}
    if category.get("resourceFamily") != "Compute":
        return None
    market = _MARKETS.get(str(category.get("usageType")))
    description = str(sku.get("description", ""))
    if market is None or _IGNORED.search(description):
        return None
    if m := _GPU_SKU.match(description):
        return "gpu", m.group("name").lower(), market
    if m := _HOST_SKU.match(description):
        return (
            ("core" if m.group("part").lower() == "core" else "ram"),
            m.group("family").lower(),
            market,
        )
    return None


def parse_skus(skus: Iterable[Mapping[str, Any]]) -> ComputeRates:
    """The GPU, core and RAM rates in a list of SKUs (the `skus` of catalog pages).

    When two SKUs price the same part in the same region and market, the higher price is
    kept: an estimate of cost should not err low.
    """
    rates: dict[RateKey, float] = {}
    for sku in skus:
        key = _sku_key(sku)
        if key is None:
            continue
        part, name, market = key
        price = _unit_price_usd(sku, _UNITS[part])
        if price is None:
            continue
        for region in sku.get("serviceRegions") or []:
            k = (part, name, market, str(region))
            rates[k] = max(price, rates.get(k, price))
    return ComputeRates(rates)


class BillingCatalog:
    """Compute Engine SKU rates, fetched with an API key and cached by the injected clock."""

    def __init__(
        self,
        api_key: str | None,
        *,
        clock: Clock,
        endpoint: str = BILLING_ENDPOINT,
        ttl_s: float = DEFAULT_TTL_S,
        error_ttl_s: float = DEFAULT_ERROR_TTL_S,
        timeout_s: float = 30.0,
        session: requests.Session | None = None,
    ) -> None:
        self._api_key = api_key
        self._clock = clock
        self._endpoint = endpoint.rstrip("/")
        self._ttl_s = ttl_s
        self._error_ttl_s = error_ttl_s
        self._timeout_s = timeout_s
        self._session = session
        self._cached: ComputeRates | None = None
        self._expires_s = float("-inf")

    def rates(self) -> ComputeRates | None:
        """The current rates, or None (no key, or the last fetch failed): use list prices."""
        if not self._api_key:
            return None
        now_s = self._clock.now().timestamp()
        if now_s < self._expires_s:
            return self._cached
        self._cached = self._fetch()
        self._expires_s = now_s + (self._ttl_s if self._cached is not None else self._error_ttl_s)
        return self._cached

    def _fetch(self) -> ComputeRates | None:
        import requests

        session = self._session or requests.Session()
        url = f"{self._endpoint}/v1/services/{COMPUTE_SERVICE_ID}/skus"
        headers = {"X-Goog-Api-Key": self._api_key or "", "Accept": "application/json"}
        skus: list[Mapping[str, Any]] = []
        token = ""
        try:
            for _ in range(MAX_PAGES):
                params = {"currencyCode": "USD", "pageSize": str(PAGE_SIZE)}
                if token:
                    params["pageToken"] = token
                response = session.get(url, params=params, headers=headers, timeout=self._timeout_s)
                if response.status_code != 200:
                    # The status only: an error body or exception text may echo the request.
                    logger.warning(
                        "billing catalog answered HTTP %s; using list prices", response.status_code
                    )
                    return None
                page = response.json()
                skus.extend(page.get("skus") or [])
                token = page.get("nextPageToken") or ""
                if not token:
                    break
            else:
                logger.warning("billing catalog: more than %s pages; using list prices", MAX_PAGES)
                return None
        except (requests.RequestException, ValueError, AttributeError, TypeError) as exc:
            logger.warning(
                "billing catalog unreachable or malformed (%s); using list prices",
                type(exc).__name__,
            )
            return None
        rates = parse_skus(skus)
        logger.info(
            "billing catalog: %s SKUs, %s GPU machine rates",
            len(skus),
            len(rates.usd_per_unit_hour),
        )
        return rates
