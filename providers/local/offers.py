"""Offers for local "regions", so a scenario can price them and a policy can choose.

A local region is a directory on this machine; its offers are priced by whatever signals
the scenario generates for their ids. The GPU type defaults to "local", which the catalog
does not know: give jobs a throughput override for it (`JobSpec.throughput={"local": 1.0}`)
or pass a catalog GPU type (e.g. "L4") to pretend the machine has one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from orchestrator import catalog
from orchestrator.model import Market, Offer

LOCAL_CLOUD = "local"
LOCAL_INSTANCE_TYPE = "local-cpu"
# A desktop CPU under a training load draws tens of watts; the figure only has to be small
# and positive so energy and carbon are accounted.
DEFAULT_POWER_KW = 0.05
UNKNOWN_GRID_ZONE = "unknown"  # as orchestrator.signals.grid names a zone it cannot find

_REGION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_region_name(region: str) -> str:
    """`region` if it is usable as one directory name, else ValueError."""
    if not _REGION_NAME.fullmatch(region):
        raise ValueError(
            f"local region {region!r}: expected letters, digits, '.', '_' or '-' "
            "(one directory name, not starting with '.' or '-')"
        )
    return region


def local_offers(
    regions: Sequence[str],
    *,
    gpu_type: str = "local",
    gpu_count: int = 1,
    grid_zones: Mapping[str, str] | None = None,
    markets: Sequence[Market] = (Market.ON_DEMAND, Market.SPOT),
    power_kw: float = DEFAULT_POWER_KW,
    instance_type: str = LOCAL_INSTANCE_TYPE,
) -> list[Offer]:
    """One offer per (region, market): cloud "local", zone = region, PUE of "local".

    `grid_zones` maps a region to the electricity zone whose carbon it is charged
    (e.g. {"west": "US-CAL-CISO", "north": "SE"}); regions missing from it get "unknown".

    >>> [o.id for o in local_offers(["west"], markets=[Market.SPOT])]
    ['local:west:local-cpu:spot']
    """
    if gpu_count < 1:
        raise ValueError(f"gpu_count must be >= 1, got {gpu_count}")
    if not power_kw > 0:
        raise ValueError(f"power_kw must be > 0, got {power_kw}")
    zones = grid_zones or {}
    pue = catalog.pue(LOCAL_CLOUD)
    offers = []
    for region in regions:
        check_region_name(region)
        for market in markets:
            offers.append(
                Offer(
                    id=Offer.make_id(LOCAL_CLOUD, region, instance_type, market),
                    cloud=LOCAL_CLOUD,
                    region=region,
                    zone=region,
                    instance_type=instance_type,
                    gpu_type=gpu_type,
                    gpu_count=gpu_count,
                    market=market,
                    grid_zone=zones.get(region, UNKNOWN_GRID_ZONE),
                    power_kw=power_kw,
                    pue=pue,
                )
            )
    return offers
