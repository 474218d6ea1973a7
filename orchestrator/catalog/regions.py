"""Cloud regions: where they are, which electricity zone feeds them, and facility PUE.

Grid zones are Electricity Maps zone ids. Rows marked [map] are transcribed from the
project's `carbon/cloud_region_to_grid_zone_mapping.csv` (compiled from GCP
region-carbon-info locations and the providers' region lists, cross-checked against the
Green Software Foundation real-time-cloud metadata); the other rows take the data-centre
city from the provider's public region list (AWS "Regions and Availability Zones", GCP
"Regions and zones", Azure "Azure geographies") and the zone from the Electricity Maps zone
list for that place. The data files are not read at run time.

Continents: "na", "sa", "eu", "asia", "oceania", "africa", "me" (Middle East), "unknown".

Each cloud is one `CloudGeography` (its regions, fleet PUE and how a zone names its region)
in a table the lookups below read; nothing here branches on a cloud's name. The built-in
clouds' facts are written here (policies and replays read them without any adapter); a
cloud added as a plug-in (providers/registry.py) registers its own with `register_cloud`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from orchestrator.errors import UnknownNameError

UNKNOWN_CONTINENT: Final = "unknown"
CONTINENTS: Final = ("na", "sa", "eu", "asia", "oceania", "africa", "me")


@dataclass(frozen=True, slots=True)
class RegionInfo:
    """One cloud region: where it is, its grid zone (None if not known) and continent."""

    location: str
    grid_zone: str | None
    continent: str


def _table(rows: Mapping[str, tuple[str, str | None, str]]) -> Mapping[str, RegionInfo]:
    return MappingProxyType({r: RegionInfo(loc, z, c) for r, (loc, z, c) in rows.items()})


def _no_zones(zone: str) -> str | None:
    return None


@dataclass(frozen=True, slots=True)
class CloudGeography:
    """Where a cloud is: its regions (name -> `RegionInfo`), its fleet PUE, and
    `zone_region`, the region a zone name belongs to (None: not one of its zone names)."""

    name: str
    regions: Mapping[str, RegionInfo]
    pue: float
    zone_region: Callable[[str], str | None] = field(default=_no_zones)


# region: (location, Electricity Maps zone, continent)
_AWS: Final = _table(
    {
        "us-east-1": ("N. Virginia", "US-MIDA-PJM", "na"),  # [map] Dominion zone of PJM
        "us-east-2": ("Ohio", "US-MIDA-PJM", "na"),  # [map] AEP Ohio is in PJM
        "us-west-1": ("N. California", "US-CAL-CISO", "na"),  # [map]
        "us-west-2": ("Oregon", "US-NW-BPAT", "na"),  # [map] BPA balancing area
        "ca-central-1": ("Montreal", "CA-QC", "na"),  # [map]
        "ca-west-1": ("Calgary", "CA-AB", "na"),  # AWS regions list; EM zone CA-AB
        "sa-east-1": ("Sao Paulo", "BR-CS", "sa"),  # [map]
        "eu-west-1": ("Ireland", "IE", "eu"),  # [map]
        "eu-west-2": ("London", "GB", "eu"),  # [map]
        "eu-west-3": ("Paris", "FR", "eu"),  # [map]
        "eu-central-1": ("Frankfurt", "DE", "eu"),  # [map]
        "eu-central-2": ("Zurich", "CH", "eu"),  # AWS regions list; EM zone CH
        "eu-north-1": ("Stockholm", "SE-SE3", "eu"),  # [map] bidding zone SE3
        "eu-south-1": ("Milan", "IT-NO", "eu"),  # AWS regions list; EM zone IT-NO (North Italy)
        "eu-south-2": ("Spain (Aragon)", "ES", "eu"),  # [map]
        "ap-northeast-1": ("Tokyo", "JP-TK", "asia"),  # [map]
        "ap-northeast-2": ("Seoul", "KR", "asia"),  # [map]
        "ap-northeast-3": ("Osaka", "JP-KN", "asia"),  # AWS regions list; EM zone JP-KN (Kansai)
        "ap-south-1": ("Mumbai", "IN-WE", "asia"),  # [map]
        "ap-south-2": ("Hyderabad", "IN-SO", "asia"),  # AWS regions list; EM zone IN-SO
        "ap-southeast-1": ("Singapore", "SG", "asia"),  # [map]
        "ap-southeast-2": ("Sydney", "AU-NSW", "oceania"),  # [map]
        "ap-southeast-3": ("Jakarta", "ID", "asia"),  # AWS regions list; EM zone ID
        "ap-southeast-4": ("Melbourne", "AU-VIC", "oceania"),  # AWS regions list; EM AU-VIC
        "ap-east-1": ("Hong Kong", "HK", "asia"),  # AWS regions list; EM zone HK
        "me-central-1": ("UAE", "AE", "me"),  # AWS regions list; EM zone AE
        "me-south-1": ("Bahrain", "BH", "me"),  # AWS regions list; EM zone BH
        "il-central-1": ("Tel Aviv", "IL", "me"),  # AWS regions list; EM zone IL
        "af-south-1": ("Cape Town", "ZA", "africa"),  # AWS regions list; EM zone ZA
    }
)

_GCP: Final = _table(
    {
        "us-central1": ("Council Bluffs, Iowa", "US-MIDW-MISO", "na"),  # [map]
        "us-east1": ("Moncks Corner, South Carolina", "US-CAR-SC", "na"),  # [map] Santee Cooper
        "us-east4": ("Ashburn, N. Virginia", "US-MIDA-PJM", "na"),  # [map]
        "us-east5": ("Columbus, Ohio", "US-MIDA-PJM", "na"),  # [map]
        "us-south1": ("Dallas", "US-TEX-ERCO", "na"),  # [map]
        "us-west1": ("The Dalles, Oregon", "US-NW-BPAT", "na"),  # [map]
        "us-west2": ("Los Angeles", "US-CAL-LDWP", "na"),  # [map] LADWP balancing area
        "us-west3": ("Salt Lake City", "US-NW-PACE", "na"),  # [map]
        "us-west4": ("Las Vegas", "US-NW-NEVP", "na"),  # [map]
        "northamerica-northeast1": ("Montreal", "CA-QC", "na"),  # [map]
        "northamerica-northeast2": ("Toronto", "CA-ON", "na"),  # [map]
        "northamerica-south1": ("Queretaro", "MX", "na"),  # GCP regions list; EM zone MX
        "southamerica-east1": ("Sao Paulo", "BR-CS", "sa"),  # GCP region-carbon-info; EM BR-CS
        "southamerica-west1": ("Santiago", "CL-SEN", "sa"),  # [map]
        "europe-west1": ("St. Ghislain, Belgium", "BE", "eu"),  # [map]
        "europe-west2": ("London", "GB", "eu"),  # [map]
        "europe-west3": ("Frankfurt", "DE", "eu"),  # [map]
        "europe-west4": ("Eemshaven, Netherlands", "NL", "eu"),  # [map]
        "europe-west6": ("Zurich", "CH", "eu"),  # [map]
        "europe-west8": ("Milan", "IT-NO", "eu"),  # [map]
        "europe-west9": ("Paris", "FR", "eu"),  # [map]
        "europe-west10": ("Berlin", "DE", "eu"),  # GCP region-carbon-info; EM zone DE
        "europe-west12": ("Turin", "IT-NO", "eu"),  # GCP region-carbon-info; Piedmont is IT-NO
        "europe-north1": ("Hamina, Finland", "FI", "eu"),  # [map]
        "europe-north2": ("Stockholm", "SE-SE3", "eu"),  # [map]
        "europe-southwest1": ("Madrid", "ES", "eu"),  # [map]
        "europe-central2": ("Warsaw", "PL", "eu"),  # [map]
        "asia-east1": ("Changhua County, Taiwan", "TW", "asia"),  # GCP region-carbon-info; EM TW
        "asia-east2": ("Hong Kong", "HK", "asia"),  # GCP region-carbon-info; EM zone HK
        "asia-northeast1": ("Tokyo", "JP-TK", "asia"),  # [map]
        "asia-northeast2": ("Osaka", "JP-KN", "asia"),  # GCP region-carbon-info; EM JP-KN
        "asia-northeast3": ("Seoul", "KR", "asia"),  # GCP region-carbon-info; EM zone KR
        "asia-south1": ("Mumbai", "IN-WE", "asia"),  # GCP region-carbon-info; EM IN-WE
        "asia-south2": ("Delhi", "IN-NO", "asia"),  # GCP region-carbon-info; EM IN-NO
        "asia-southeast1": ("Jurong West, Singapore", "SG", "asia"),  # [map]
        "asia-southeast2": ("Jakarta", "ID", "asia"),  # GCP region-carbon-info; EM zone ID
        "australia-southeast1": ("Sydney", "AU-NSW", "oceania"),  # [map]
        "australia-southeast2": ("Melbourne", "AU-VIC", "oceania"),  # [map]
        "me-central1": ("Doha", "QA", "me"),  # GCP region-carbon-info; EM zone QA
        "me-central2": ("Dammam", "SA", "me"),  # GCP region-carbon-info; EM zone SA
        "me-west1": ("Tel Aviv", "IL", "me"),  # GCP region-carbon-info; EM zone IL
        "africa-south1": ("Johannesburg", "ZA", "africa"),  # GCP region-carbon-info; EM ZA
    }
)

_AZURE: Final = _table(
    {
        "eastus": ("Virginia", "US-MIDA-PJM", "na"),  # [map]
        "eastus2": ("Virginia", "US-MIDA-PJM", "na"),  # [map]
        "centralus": ("Iowa", "US-MIDW-MISO", "na"),  # [map]
        "northcentralus": ("Illinois", "US-MIDA-PJM", "na"),  # [map] ComEd is in PJM
        "southcentralus": ("Texas", "US-TEX-ERCO", "na"),  # [map]
        "westus": ("California", "US-CAL-CISO", "na"),  # [map]
        "westus2": ("Quincy, Washington", "US-NW-GCPD", "na"),  # [map] Grant County PUD
        "westus3": ("Phoenix, Arizona", "US-SW-SRP", "na"),  # [map] Salt River Project
        "canadacentral": ("Toronto", "CA-ON", "na"),  # [map]
        "westeurope": ("Netherlands", "NL", "eu"),  # [map]
        "northeurope": ("Ireland", "IE", "eu"),  # [map]
        "swedencentral": ("Gavle/Sandviken, Sweden", "SE-SE3", "eu"),  # [map]
        "uksouth": ("London", "GB", "eu"),  # [map]
        "francecentral": ("Paris", "FR", "eu"),  # [map]
        "germanywestcentral": ("Frankfurt", "DE", "eu"),  # [map]
        # Azure geographies (region -> data-centre place); EM zone for that place:
        "canadaeast": ("Quebec City", "CA-QC", "na"),
        "brazilsouth": ("Sao Paulo State", "BR-CS", "sa"),
        "ukwest": ("Cardiff", "GB", "eu"),
        "norwayeast": ("Oslo", "NO-NO1", "eu"),
        "switzerlandnorth": ("Zurich", "CH", "eu"),
        "italynorth": ("Milan", "IT-NO", "eu"),
        "polandcentral": ("Warsaw", "PL", "eu"),
        "spaincentral": ("Madrid", "ES", "eu"),
        "southeastasia": ("Singapore", "SG", "asia"),
        "eastasia": ("Hong Kong", "HK", "asia"),
        "japaneast": ("Tokyo, Saitama", "JP-TK", "asia"),
        "japanwest": ("Osaka", "JP-KN", "asia"),
        "koreacentral": ("Seoul", "KR", "asia"),
        "centralindia": ("Pune", "IN-WE", "asia"),
        "southindia": ("Chennai", "IN-SO", "asia"),
        "australiaeast": ("New South Wales", "AU-NSW", "oceania"),
        "australiasoutheast": ("Victoria", "AU-VIC", "oceania"),
        "uaenorth": ("Dubai", "AE", "me"),
        "qatarcentral": ("Doha", "QA", "me"),
        "southafricanorth": ("Johannesburg", "ZA", "africa"),
    }
)

# The local machine: its grid zone is whatever the configuration says (None here).
_LOCAL: Final = _table({"local": ("this machine", None, UNKNOWN_CONTINENT)})

# Power usage effectiveness (facility energy / IT energy), fleet-wide annual figures:
# Amazon: AWS global data-centre PUE 1.15 in 2023 (Amazon Sustainability); Google: fleet
# trailing-twelve-month PUE 1.10 (google.com/about/datacenters/efficiency); Microsoft
# datacenter sustainability fact sheets (2024): new designs 1.12, fleet ~1.18; the local
# machine: Uptime Institute Global Data Center Survey 2024, average PUE 1.56.
_AWS_PUE: Final = 1.15
_GCP_PUE: Final = 1.10
_AZURE_PUE: Final = 1.18
_LOCAL_PUE: Final = 1.56


def _cloud(cloud: str) -> str:
    return cloud.strip().lower()


# AWS availability-zone ids ("use1-az1") start with an abbreviation of the region:
# area + direction initials + number (AWS docs, "AZ IDs for your AWS resources").
_DIRECTIONS: Final[Mapping[str, str]] = {
    "east": "e",
    "west": "w",
    "north": "n",
    "south": "s",
    "central": "c",
    "northeast": "ne",
    "northwest": "nw",
    "southeast": "se",
    "southwest": "sw",
}


def _aws_zone_id_prefix(region: str) -> str:
    area, direction, number = region.split("-")
    return f"{area}{_DIRECTIONS[direction]}{number}"


_AWS_ZONE_ID_PREFIXES: Final[Mapping[str, str]] = {_aws_zone_id_prefix(r): r for r in _AWS}

# us-east-1a; a Local Zone us-east-1-atl-2a belongs to its parent region us-east-1.
_AWS_ZONE_NAME = re.compile(r"^([a-z]{2}(?:-gov)?-[a-z]+-\d+)(?:-[a-z]+-\d+)?[a-z]$")
# use1-az1; use1-atl2-az1 (a Local Zone id).
_AWS_ZONE_ID = re.compile(r"^([a-z]+\d+)(?:-[a-z]+\d+)?-az\d+$")
# us-central1-a
_GCP_ZONE = re.compile(r"^([a-z]+-[a-z]+\d+)-[a-z]$")
# eastus-1 (Azure names zones 1, 2, 3 within a region)
_AZURE_ZONE = re.compile(r"^([a-z0-9]+)-\d$")


def _aws_zone_region(zone: str) -> str | None:
    if m := _AWS_ZONE_NAME.match(zone):
        return m.group(1)
    if (m := _AWS_ZONE_ID.match(zone)) and m.group(1) in _AWS_ZONE_ID_PREFIXES:
        return _AWS_ZONE_ID_PREFIXES[m.group(1)]
    return None


def _pattern_region(pattern: re.Pattern[str]) -> Callable[[str], str | None]:
    def region(zone: str) -> str | None:
        m = pattern.match(zone)
        return m.group(1) if m else None

    return region


_LOCK = threading.Lock()
_GEOGRAPHIES: dict[str, CloudGeography] = {}


def register_cloud(geography: CloudGeography) -> CloudGeography:
    """Add a cloud to the catalog (a plug-in's regions, PUE and zone rule); registering
    the same record again is a no-op, a different one under a known name an error."""
    name = _cloud(geography.name)
    with _LOCK:
        known = _GEOGRAPHIES.get(name)
        if known is not None and known != geography:
            raise ValueError(f"cloud {name!r} is already in the catalog with other facts")
        _GEOGRAPHIES[name] = geography
    return geography


def geography(cloud: str) -> CloudGeography:
    """The catalog's facts about `cloud`."""
    try:
        return _GEOGRAPHIES[_cloud(cloud)]
    except KeyError:
        raise UnknownNameError("cloud", cloud, list(_GEOGRAPHIES)) from None


def clouds() -> tuple[str, ...]:
    """Every cloud the catalog knows (the built-in ones and those registered since)."""
    return tuple(_GEOGRAPHIES)


for _geo in (
    CloudGeography("aws", _AWS, _AWS_PUE, _aws_zone_region),
    CloudGeography("gcp", _GCP, _GCP_PUE, _pattern_region(_GCP_ZONE)),
    CloudGeography("azure", _AZURE, _AZURE_PUE, _pattern_region(_AZURE_ZONE)),
    CloudGeography("local", _LOCAL, _LOCAL_PUE),
):
    register_cloud(_geo)

#: The built-in clouds' regions (`geography(cloud).regions` for any cloud).
REGIONS: Final[Mapping[str, Mapping[str, RegionInfo]]] = MappingProxyType(
    {name: g.regions for name, g in _GEOGRAPHIES.items()}
)
CLOUDS: Final[tuple[str, ...]] = tuple(REGIONS)


def pue(cloud: str) -> float:
    """Fleet PUE of a cloud ("aws", "gcp", "azure", "local", or a registered one)."""
    return geography(cloud).pue


def regions(cloud: str) -> tuple[str, ...]:
    """The regions the catalog knows for `cloud`."""
    return tuple(geography(cloud).regions)


def region_of_zone(cloud: str, zone: str) -> str:
    """The region of a zone name or AWS zone id; a region name (or anything not recognised)
    is returned unchanged.

    >>> region_of_zone("aws", "use1-az4"), region_of_zone("gcp", "us-central1-a")
    ('us-east-1', 'us-central1')
    """
    geo = _GEOGRAPHIES.get(_cloud(cloud))
    if geo is None:
        return zone
    return geo.zone_region(zone.strip().lower()) or zone


def region_info(cloud: str, region: str) -> RegionInfo | None:
    """What the catalog knows about a region (a zone is accepted too), or None."""
    geo = _GEOGRAPHIES.get(_cloud(cloud))
    if geo is None:
        return None
    return geo.regions.get(region_of_zone(cloud, region).strip().lower())


def grid_zone(cloud: str, region: str) -> str | None:
    """The Electricity Maps zone feeding a region (or zone), None where unknown or local.

    >>> grid_zone("aws", "us-east-1a")
    'US-MIDA-PJM'
    """
    info = region_info(cloud, region)
    return None if info is None else info.grid_zone


def continent(cloud: str, region: str) -> str:
    """The continent code of a region (or zone); "unknown" where the region is not known."""
    info = region_info(cloud, region)
    return UNKNOWN_CONTINENT if info is None else info.continent
