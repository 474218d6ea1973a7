"""Frame keys of cloud signals, and their parsing.

- price: ``cloud/region/zone/instance_type/market`` (zone ``''`` = every zone of the region,
  market ``spot`` | ``on_demand``), e.g. ``aws/us-east-1/us-east-1a/p3.2xlarge/spot``;
- spot availability: ``cloud/region/zone/instance_type`` (zone or instance type may be
  ``''``), e.g. ``aws/us-east-1/us-east-1a/p5.48xlarge``.

Grid signals use the Electricity Maps zone id itself as the key.
"""

from __future__ import annotations

from typing import NamedTuple


class PriceKey(NamedTuple):
    cloud: str
    region: str
    zone: str
    instance_type: str
    market: str


class SpotKey(NamedTuple):
    cloud: str
    region: str
    zone: str
    instance_type: str


def price_key(cloud: str, region: str, zone: str, instance_type: str, market: str) -> str:
    return "/".join((cloud, region, zone, instance_type, market))


def spot_key(cloud: str, region: str, zone: str, instance_type: str) -> str:
    return "/".join((cloud, region, zone, instance_type))


def parse_price_key(key: str) -> PriceKey | None:
    parts = key.split("/")
    return PriceKey(*parts) if len(parts) == 5 else None


def parse_spot_key(key: str) -> SpotKey | None:
    parts = key.split("/")
    return SpotKey(*parts) if len(parts) == 4 else None
