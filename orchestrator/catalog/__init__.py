"""Built-in facts: GPU types, instance types, regions and grid zones, PUE, data transfer.

Everything here is a small table written as a Python literal, each figure with a comment
naming its public source (vendor datasheet, provider documentation or pricing page, paper).
Nothing is read from disk or the network; lookups are pure functions, so policies may import
this package.

- `gpus`: `GpuSpec` per GPU type (board power, memory, throughput relative to one
  A100-80GB), alias normalisation, and the IT power of an instance (GPUs plus host).
- `instances`: GPU type and count per instance type (AWS, GCP, Azure, local; a plug-in
  cloud adds its own with `register_instance_types`) and a few on-demand list prices used
  when a trace has no price.
- `regions`: regions per cloud with their Electricity Maps grid zone and continent, zone to
  region, and PUE per cloud: one `CloudGeography` per cloud (`register_cloud` adds one).
- `network`: data-transfer price ($/GB), default bandwidth and transfer time between
  locations: one `Egress` per cloud (`register_egress` adds one).
"""

from orchestrator.catalog.gpus import (
    GPUS,
    HOST_BASE_KW,
    HOST_PER_GPU_WATT,
    GpuSpec,
    canonical_gpu_name,
    gpu,
    instance_power_kw,
)
from orchestrator.catalog.instances import (
    FRACTIONAL_GPU_SHAPES,
    LIST_PRICES,
    InstanceParser,
    instance_gpus,
    local_instance_type,
    on_demand_usd_per_hour,
    register_instance_types,
)
from orchestrator.catalog.network import (
    Egress,
    bandwidth_gbps,
    egress_of,
    egress_usd_per_gb,
    known_clouds,
    register_egress,
    transfer_hours,
)
from orchestrator.catalog.regions import (
    CLOUDS,
    CONTINENTS,
    REGIONS,
    CloudGeography,
    RegionInfo,
    clouds,
    continent,
    geography,
    grid_zone,
    pue,
    region_info,
    region_of_zone,
    regions,
    register_cloud,
)

__all__ = [
    "CLOUDS",
    "CONTINENTS",
    "FRACTIONAL_GPU_SHAPES",
    "GPUS",
    "HOST_BASE_KW",
    "HOST_PER_GPU_WATT",
    "LIST_PRICES",
    "REGIONS",
    "CloudGeography",
    "Egress",
    "GpuSpec",
    "InstanceParser",
    "RegionInfo",
    "bandwidth_gbps",
    "canonical_gpu_name",
    "clouds",
    "continent",
    "egress_of",
    "egress_usd_per_gb",
    "geography",
    "gpu",
    "grid_zone",
    "instance_gpus",
    "instance_power_kw",
    "known_clouds",
    "local_instance_type",
    "on_demand_usd_per_hour",
    "pue",
    "region_info",
    "region_of_zone",
    "regions",
    "register_cloud",
    "register_egress",
    "register_instance_types",
    "transfer_hours",
]
