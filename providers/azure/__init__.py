"""Azure adapter (azure-mgmt-compute and azure-identity, imported lazily; extra `azure`).

- `provider`: `AzureProvider`, the ComputeProvider for Spot and on-demand N-series VMs, and
  `AzureLaunchConfig` (subnets, SSH key, image, disk, managed identity).
- `prices`: hourly prices from the public Azure Retail Prices API (list prices as fallback).
- `errors`: ARM error codes as `ProviderFailure`s.
- `notices`: Spot eviction notices from Scheduled Events inside the VM, for the training SDK.
- `regions`: Azure region -> Electricity Maps grid zone (the catalog's table, plus more).

The actions it needs are exactly those in infra/azure/role.json.
"""

from typing import Any

from providers.azure.prices import PriceQuote, RetailPriceCatalog, RetailPrices, parse_items
from providers.azure.provider import AzureLaunchConfig, AzureProvider
from providers.azure.regions import grid_zone


def __getattr__(name: str) -> Any:
    """The notice reader lives in the training SDK, whose package imports torch: it is
    imported only when asked for, so the cloud registry stays light."""
    if name in ("AzureScheduledEvents", "preemption_notice"):
        from providers.azure import notices

        return getattr(notices, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AzureLaunchConfig",
    "AzureProvider",
    "AzureScheduledEvents",
    "PriceQuote",
    "RetailPriceCatalog",
    "RetailPrices",
    "grid_zone",
    "parse_items",
    "preemption_notice",
]
