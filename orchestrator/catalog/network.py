"""Moving a checkpoint: data-transfer price ($/GB) and default bandwidth between locations.

Prices are first-tier list prices for data leaving the source (what the source's bill
shows), approximated per continent: the providers publish per-region tables and individual
regions differ by a cent or two. Ingress is free on AWS, GCP and Azure, so data leaving the
local machine or the internet costs nothing here. `Location.cloud` may be any cloud with an
`Egress` record (the built-in ones below, or one registered by a plug-in with
`register_egress`), "local" (this machine) or "internet" (anything outside the clouds).
Nothing here branches on a cloud's name: each cloud's prices are one `Egress`.

Bandwidth defaults are what one copy job (a few parallel streams from one VM or to an
object store) can expect; measure and override them in configuration when it matters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from orchestrator.catalog.regions import UNKNOWN_CONTINENT, continent, region_of_zone
from orchestrator.errors import UnknownNameError
from orchestrator.model import Location

LOCAL: Final = "local"
INTERNET: Final = "internet"


@dataclass(frozen=True, slots=True)
class Egress:
    """What data leaving one cloud costs ($/GB, paid at the source).

    `inter_region(src_region, dst_region, src_continent, dst_continent)` prices a copy to
    another region of the same cloud; `internet(src_continent)` a copy out of the cloud.
    """

    cross_zone: float
    inter_region: Callable[[str, str, str, str], float]
    internet: Callable[[str], float]


def free(*_: str) -> float:
    """No charge (a site whose uplink is not billed per GB)."""
    return 0.0


# --- prices, $/GB -----------------------------------------------------------------------

# Between availability zones of one region: AWS EC2 on-demand pricing, "Data Transfer":
# $0.01/GB in each direction; GCP network pricing: data transfer between zones of a region
# $0.01/GB; Azure bandwidth pricing: no charge between availability zones (2024).
_AWS_CROSS_ZONE: Final = 0.01
_GCP_CROSS_ZONE: Final = 0.01
_AZURE_CROSS_ZONE: Final = 0.0

# AWS EC2 on-demand pricing, "Data Transfer to other AWS regions", by source continent:
# $0.02 from US/Canada/Europe, ~$0.09 Asia, ~$0.098 Sydney, ~$0.138 Sao Paulo,
# ~$0.11 Middle East, ~$0.147 Cape Town.
_AWS_INTER_REGION: Final[Mapping[str, float]] = MappingProxyType(
    {
        "na": 0.02,
        "eu": 0.02,
        "asia": 0.09,
        "oceania": 0.098,
        "sa": 0.138,
        "me": 0.11,
        "africa": 0.147,
    }
)
# AWS EC2 on-demand pricing: us-east-1 <-> us-east-2 is $0.01/GB.
_AWS_PAIR_OVERRIDES: Final[Mapping[frozenset[str], float]] = MappingProxyType(
    {frozenset({"us-east-1", "us-east-2"}): 0.01}
)
# AWS EC2 on-demand pricing, "Data Transfer OUT to Internet", first 10 TB/month, by
# source continent ($0.09 US/EU; ~$0.11-0.13 Asia; $0.114 Sydney; $0.15 Sao Paulo ...).
_AWS_INTERNET: Final[Mapping[str, float]] = MappingProxyType(
    {
        "na": 0.09,
        "eu": 0.09,
        "asia": 0.12,
        "oceania": 0.114,
        "sa": 0.15,
        "me": 0.117,
        "africa": 0.154,
    }
)

# GCP network pricing, "Data transfer within Google Cloud" (inter-region, Premium tier):
# within Northern America or Europe $0.02/GB, within Asia $0.05, within other continents
# $0.08; between Northern America and Europe $0.05; other inter-continental $0.08; any
# transfer to or from Oceania $0.15 (the Oceania rate applies to intra-Oceania too).
_GCP_SAME_CONTINENT: Final[Mapping[str, float]] = MappingProxyType(
    {"na": 0.02, "eu": 0.02, "asia": 0.05}
)
_GCP_OTHER_SAME_CONTINENT: Final = 0.08
_GCP_NA_EU: Final = 0.05
_GCP_INTERCONTINENTAL: Final = 0.08
_GCP_OCEANIA: Final = 0.15
# GCP network pricing, internet egress Premium tier, 0-1 TB/month, worldwide destinations
# (excluding China and Australia): $0.12/GB.
_GCP_INTERNET: Final = 0.12

# Azure bandwidth pricing, "Data transfer between Azure regions": within North America or
# Europe $0.02/GB, within Asia, Oceania or the Middle East $0.08, within South America or
# Africa $0.16; between continents $0.05 from North America/Europe, $0.08 from
# Asia/Oceania/Middle East, $0.16 from South America/Africa.
_AZURE_SAME_CONTINENT: Final[Mapping[str, float]] = MappingProxyType(
    {"na": 0.02, "eu": 0.02, "asia": 0.08, "oceania": 0.08, "me": 0.08, "sa": 0.16, "africa": 0.16}
)
_AZURE_INTERCONTINENTAL: Final[Mapping[str, float]] = MappingProxyType(
    {"na": 0.05, "eu": 0.05, "asia": 0.08, "oceania": 0.08, "me": 0.08, "sa": 0.16, "africa": 0.16}
)
# Azure bandwidth pricing, internet egress (Microsoft premium network), first 10 TB/month:
# zone 1 (North America, Europe) $0.087/GB, zone 2 (Asia, Oceania, Middle East, Africa)
# $0.12, zone 3 (Brazil) $0.181.
_AZURE_INTERNET: Final[Mapping[str, float]] = MappingProxyType(
    {
        "na": 0.087,
        "eu": 0.087,
        "asia": 0.12,
        "oceania": 0.12,
        "me": 0.12,
        "africa": 0.12,
        "sa": 0.181,
    }
)


def _aws_inter_region(src: str, dst: str, a: str, b: str) -> float:
    pair = _AWS_PAIR_OVERRIDES.get(frozenset({src, dst}))
    if pair is not None:
        return pair
    return _AWS_INTER_REGION.get(a, max(_AWS_INTER_REGION.values()))


def _gcp_inter_region(src: str, dst: str, a: str, b: str) -> float:
    if UNKNOWN_CONTINENT in (a, b) or "oceania" in (a, b):
        return _GCP_OCEANIA
    if a == b:
        return _GCP_SAME_CONTINENT.get(a, _GCP_OTHER_SAME_CONTINENT)
    return _GCP_NA_EU if {a, b} == {"na", "eu"} else _GCP_INTERCONTINENTAL


def _azure_inter_region(src: str, dst: str, a: str, b: str) -> float:
    table = _AZURE_SAME_CONTINENT if a == b else _AZURE_INTERCONTINENTAL
    return table.get(a, max(table.values()))


def _by_continent(table: Mapping[str, float]) -> Callable[[str], float]:
    """A price per source continent; an unknown continent gets the highest of the table."""

    def price(a: str) -> float:
        return table.get(a, max(table.values()))

    return price


_LOCK = threading.Lock()
_EGRESS: dict[str, Egress] = {}


def register_egress(cloud: str, egress: Egress) -> Egress:
    """Add a cloud's data-transfer prices (a plug-in's); the same record again is a no-op."""
    name = cloud.strip().lower()
    if name in (LOCAL, INTERNET):
        raise ValueError(f"{name!r} is not a cloud name")
    with _LOCK:
        known = _EGRESS.get(name)
        if known is not None and known != egress:
            raise ValueError(f"cloud {name!r} already has other egress prices")
        _EGRESS[name] = egress
    return egress


def egress_of(cloud: str) -> Egress:
    try:
        return _EGRESS[cloud.strip().lower()]
    except KeyError:
        raise UnknownNameError("cloud", cloud, [*_EGRESS, LOCAL, INTERNET]) from None


for _name, _egress in (
    ("aws", Egress(_AWS_CROSS_ZONE, _aws_inter_region, _by_continent(_AWS_INTERNET))),
    ("gcp", Egress(_GCP_CROSS_ZONE, _gcp_inter_region, lambda a: _GCP_INTERNET)),
    ("azure", Egress(_AZURE_CROSS_ZONE, _azure_inter_region, _by_continent(_AZURE_INTERNET))),
):
    register_egress(_name, _egress)


def known_clouds() -> tuple[str, ...]:
    """Every cloud a `Location` may name: those with egress prices, local and internet."""
    return (*_EGRESS, LOCAL, INTERNET)


def _norm_cloud(cloud: str) -> str:
    c = cloud.strip().lower()
    if c not in _EGRESS and c not in (LOCAL, INTERNET):
        raise UnknownNameError("cloud", cloud, list(known_clouds()))
    return c


def _region(loc: Location, cloud: str) -> str:
    return region_of_zone(cloud, loc.region).strip().lower()


def _same_region(src: Location, dst: Location) -> bool:
    s, d = _norm_cloud(src.cloud), _norm_cloud(dst.cloud)
    if s != d:
        return False
    if s == LOCAL:
        return True  # one machine
    return _region(src, s) == _region(dst, d)


def egress_usd_per_gb(src: Location, dst: Location) -> float:
    """List price ($/GB) of moving data from `src` to `dst`, paid at the source.

    Same zone 0; another zone of the region: the cloud's cross-zone rate; another region of
    the same cloud: its inter-region rate; another cloud or the internet: the source's
    internet egress rate (never below its inter-region rate for that distance). Data
    leaving the local machine or the internet is free (ingress is not billed).

    >>> egress_usd_per_gb(Location("aws", "us-east-1"), Location("aws", "eu-west-1"))
    0.02
    """
    s, d = _norm_cloud(src.cloud), _norm_cloud(dst.cloud)
    if s in (LOCAL, INTERNET):
        return 0.0
    egress = _EGRESS[s]
    src_region, dst_region = _region(src, s), _region(dst, d)
    a, b = continent(s, src_region), continent(d, dst_region)
    if s == d:
        if src_region == dst_region:
            if src.zone and dst.zone and src.zone.strip().lower() != dst.zone.strip().lower():
                return egress.cross_zone
            return 0.0
        return egress.inter_region(src_region, dst_region, a, b)
    # Another cloud, the local machine or the internet: billed as internet egress.
    internet = egress.internet(a)
    if d in (LOCAL, INTERNET):
        return internet
    far = egress.inter_region(src_region, dst_region, a, b)
    return max(internet, far)


# --- bandwidth, Gbit/s ------------------------------------------------------------------

# Within a region the copy goes to or from the regional object store; S3 sustains up to
# 100 Gbit/s per instance with parallel connections (AWS "Performance design patterns for
# Amazon S3"); we assume a modest 10 Gbit/s.
SAME_REGION_GBPS: Final = 10.0
# Between regions of one cloud: AWS limits a single flow leaving the region to 5 Gbit/s
# (AWS EC2 docs, "Amazon EC2 instance network bandwidth").
CROSS_REGION_GBPS: Final = 5.0
# Between clouds on one continent: Skyplane (Jain et al., NSDI'23) measures single-VM
# inter-cloud throughput of a few Gbit/s, below intra-cloud; we take 2.5 Gbit/s.
CROSS_CLOUD_GBPS: Final = 2.5
# Between continents (or where a continent is unknown): long round-trip times cut TCP
# throughput to about 1 Gbit/s per VM in Skyplane's measurements (NSDI'23).
CROSS_CONTINENT_GBPS: Final = 1.0
# To or from the local machine: an assumed 1 Gbit/s site uplink (configure the real one).
LOCAL_UPLINK_GBPS: Final = 1.0


def bandwidth_gbps(src: Location, dst: Location) -> float:
    """Default bandwidth (Gbit/s) of a checkpoint copy from `src` to `dst`."""
    if _same_region(src, dst):
        return SAME_REGION_GBPS
    s, d = _norm_cloud(src.cloud), _norm_cloud(dst.cloud)
    if LOCAL in (s, d):
        return LOCAL_UPLINK_GBPS
    a = continent(s, src.region)
    b = continent(d, dst.region)
    if UNKNOWN_CONTINENT in (a, b) or a != b:
        return CROSS_CONTINENT_GBPS
    return CROSS_REGION_GBPS if s == d else CROSS_CLOUD_GBPS


def transfer_hours(size_gb: float, src: Location, dst: Location) -> float:
    """Hours to copy `size_gb` (decimal GB) from `src` to `dst`; 0 within one region."""
    if size_gb < 0:
        raise ValueError(f"size_gb must be >= 0, got {size_gb}")
    if _same_region(src, dst):
        return 0.0
    return size_gb * 8.0 / bandwidth_gbps(src, dst) / 3600.0
