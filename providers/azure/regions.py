"""Azure regions -> Electricity Maps grid zones, for carbon.

The catalog (orchestrator/catalog/regions.py) knows fifteen Azure regions. The GPU sizes
Heliotrope buys are sold in more; the rows here add those, each with the data-centre place
from Azure's public region list ("Azure geographies") and the Electricity Maps zone for that
place. `grid_zone` reads the catalog first, so a region is described in one place only; a
test checks the two tables do not overlap. (The cloud registry will fold this table into
the catalog's.)
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from orchestrator import catalog
from orchestrator.catalog import RegionInfo

CLOUD: Final = "azure"

EXTRA_REGIONS: Final[Mapping[str, RegionInfo]] = MappingProxyType(
    {
        "canadaeast": RegionInfo("Quebec City", "CA-QC", "na"),
        "brazilsouth": RegionInfo("Sao Paulo State", "BR-CS", "sa"),
        "ukwest": RegionInfo("Cardiff", "GB", "eu"),
        "norwayeast": RegionInfo("Oslo", "NO-NO1", "eu"),
        "switzerlandnorth": RegionInfo("Zurich", "CH", "eu"),
        "italynorth": RegionInfo("Milan", "IT-NO", "eu"),
        "polandcentral": RegionInfo("Warsaw", "PL", "eu"),
        "spaincentral": RegionInfo("Madrid", "ES", "eu"),
        "southeastasia": RegionInfo("Singapore", "SG", "asia"),
        "eastasia": RegionInfo("Hong Kong", "HK", "asia"),
        "japaneast": RegionInfo("Tokyo, Saitama", "JP-TK", "asia"),
        "japanwest": RegionInfo("Osaka", "JP-KN", "asia"),
        "koreacentral": RegionInfo("Seoul", "KR", "asia"),
        "centralindia": RegionInfo("Pune", "IN-WE", "asia"),
        "southindia": RegionInfo("Chennai", "IN-SO", "asia"),
        "australiaeast": RegionInfo("New South Wales", "AU-NSW", "oceania"),
        "australiasoutheast": RegionInfo("Victoria", "AU-VIC", "oceania"),
        "uaenorth": RegionInfo("Dubai", "AE", "me"),
        "qatarcentral": RegionInfo("Doha", "QA", "me"),
        "southafricanorth": RegionInfo("Johannesburg", "ZA", "africa"),
    }
)


def region_info(region: str) -> RegionInfo | None:
    """What is known about an Azure region (a zone such as `eastus-1` is accepted too)."""
    known = catalog.region_info(CLOUD, region)
    if known is not None:
        return known
    return EXTRA_REGIONS.get(catalog.region_of_zone(CLOUD, region).strip().lower())


def grid_zone(region: str) -> str | None:
    """The Electricity Maps zone feeding an Azure region, or None where unknown.

    >>> grid_zone("swedencentral"), grid_zone("japaneast"), grid_zone("atlantis")
    ('SE-SE3', 'JP-TK', None)
    """
    info = region_info(region)
    return None if info is None else info.grid_zone


def known_regions() -> tuple[str, ...]:
    """Every Azure region with a grid zone: the catalog's and this table's."""
    return tuple(sorted({*catalog.regions(CLOUD), *EXTRA_REGIONS}))
