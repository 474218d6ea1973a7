"""Azure regions -> Electricity Maps grid zones, for carbon: the catalog's table
(orchestrator/catalog/regions.py, Azure's `CloudGeography`), where the GPU regions this
adapter was built with were folded in; one place describes a region.
"""

from __future__ import annotations

from typing import Final

from orchestrator import catalog
from orchestrator.catalog import RegionInfo

CLOUD: Final = "azure"


def region_info(region: str) -> RegionInfo | None:
    """What is known about an Azure region (a zone such as `eastus-1` is accepted too)."""
    return catalog.region_info(CLOUD, region)


def grid_zone(region: str) -> str | None:
    """The Electricity Maps zone feeding an Azure region, or None where unknown.

    >>> grid_zone("swedencentral"), grid_zone("japaneast"), grid_zone("atlantis")
    ('SE-SE3', 'JP-TK', None)
    """
    info = region_info(region)
    return None if info is None else info.grid_zone


def known_regions() -> tuple[str, ...]:
    """Every Azure region with a grid zone."""
    return tuple(sorted(r for r in catalog.regions(CLOUD) if grid_zone(r)))
