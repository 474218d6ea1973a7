"""Frame keys of cloud signals.

- price: ``cloud/region/zone/instance_type/market`` (zone ``''`` = every zone of the region,
  market ``spot`` | ``on_demand``), e.g. ``aws/us-east-1/us-east-1a/p3.2xlarge/spot``;
- spot availability: ``cloud/region/zone/instance_type`` (zone or instance type may be
  ``''``), e.g. ``aws/us-east-1/us-east-1a/p5.48xlarge``.

Grid signals use the Electricity Maps zone id itself as the key.
"""

from __future__ import annotations


def price_key(cloud: str, region: str, zone: str, instance_type: str, market: str) -> str:
    return "/".join((cloud, region, zone, instance_type, market))


def spot_key(cloud: str, region: str, zone: str, instance_type: str) -> str:
    return "/".join((cloud, region, zone, instance_type))
