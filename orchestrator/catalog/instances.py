"""Instance types: which GPUs (and how many) each one carries, and a few list prices.

Facts come from the providers' instance-type pages: AWS "Amazon EC2 instance types"
(accelerated computing: P2, P3, P4, P5, P6, G4dn, G5, G6, G6e), GCP "GPU machine types"
(A2, A3, A4, G2, G4) and Azure's N-series size pages. Local instance types are named
`local-<gpu>x<count>` (see `local_instance_type`), e.g. "local-l4x1", "local-a100-80gbx2".
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from orchestrator.catalog.gpus import canonical_gpu_name

# AWS: family -> GPU type; size -> GPU count (AWS "Amazon EC2 instance types", accelerated
# computing, and the per-family pages).
_AWS_FAMILY_GPU: Final[Mapping[str, str]] = {
    "p2": "K80",  # EC2 P2: NVIDIA K80 (one GK210 per "GPU")
    "p3": "V100",  # EC2 P3: V100 16 GB
    "p3dn": "V100-32GB",  # EC2 P3dn: V100 32 GB
    "p4d": "A100-40GB",  # EC2 P4d: A100 40 GB
    "p4de": "A100-80GB",  # EC2 P4de: A100 80 GB
    "p5": "H100",  # EC2 P5: H100
    "p5e": "H200",  # EC2 P5e: H200
    "p5en": "H200",  # EC2 P5en: H200
    "p6-b200": "B200",  # EC2 P6-B200
    "p6-b300": "B300",  # EC2 P6-B300
    "g4dn": "T4",  # EC2 G4dn: T4
    "g5": "A10G",  # EC2 G5: A10G
    "g6": "L4",  # EC2 G6: L4
    "gr6": "L4",  # EC2 Gr6: L4
    "g6e": "L40S",  # EC2 G6e: L40S
}
_AWS_COUNTS: Final[Mapping[str, Mapping[str, int]]] = {
    "p2": {"xlarge": 1, "8xlarge": 8, "16xlarge": 16},
    "p3": {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8},
    "p3dn": {"24xlarge": 8},
    "p4d": {"24xlarge": 8},
    "p4de": {"24xlarge": 8},
    "p5": {"4xlarge": 1, "48xlarge": 8},
    "p5e": {"48xlarge": 8},
    "p5en": {"48xlarge": 8},
    "p6-b200": {"48xlarge": 8},
    "p6-b300": {"48xlarge": 8},
    "g4dn": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "metal": 8,
    },
    "g5": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "24xlarge": 4,
        "48xlarge": 8,
    },
    "g6": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "24xlarge": 4,
        "48xlarge": 8,
    },
    "gr6": {"4xlarge": 1, "8xlarge": 1},
    "g6e": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "24xlarge": 4,
        "48xlarge": 8,
    },
}

# GCP accelerator-optimized series with a "-<N>g" suffix (GCP "GPU machine types"):
# the suffix is the GPU count.
_GCP_SERIES_GPU: Final[Mapping[str, str]] = {
    "a2-highgpu": "A100-40GB",  # A2 Standard: A100 40 GB
    "a2-megagpu": "A100-40GB",  # A2 Standard, 16 GPUs
    "a2-ultragpu": "A100-80GB",  # A2 Ultra: A100 80 GB
    "a3-highgpu": "H100",  # A3 High: H100 80 GB
    "a3-megagpu": "H100",  # A3 Mega: H100 80 GB
    "a3-edgegpu": "H100",  # A3 Edge: H100 80 GB
    "a3-ultragpu": "H200",  # A3 Ultra: H200 141 GB
    "a4-highgpu": "B200",  # A4: B200
}
_GCP_SUFFIX = re.compile(r"^([a-z0-9]+-[a-z]+gpu)-(\d+)g$")
# G2 (L4) and G4 (RTX PRO 6000): the count depends on the vCPU count (GCP "GPU machine
# types", G2 and G4 tables).
_GCP_BY_VCPUS: Final[Mapping[str, tuple[str, Mapping[int, int]]]] = {
    "g2-standard": ("L4", {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}),
    "g4-standard": ("RTX-PRO-6000", {48: 1, 96: 2, 192: 4, 384: 8}),
}

# Shapes with a fraction of a GPU (NVIDIA vGPU slices): not usable for a training gang, so
# `instance_gpus` returns None for them. GCP "GPU machine types", G4: g4-standard-6/12/24
# carry 1/8, 1/4 and 1/2 of an RTX PRO 6000.
FRACTIONAL_GPU_SHAPES: Final[Mapping[tuple[str, str], tuple[str, float]]] = MappingProxyType(
    {
        ("gcp", "g4-standard-6"): ("RTX-PRO-6000", 0.125),
        ("gcp", "g4-standard-12"): ("RTX-PRO-6000", 0.25),
        ("gcp", "g4-standard-24"): ("RTX-PRO-6000", 0.5),
    }
)

# Azure N-series sizes (Azure "Sizes for virtual machines": NCasT4_v3, NCv3, NC A100 v4,
# ND A100 v4, NDm A100 v4, ND H100 v5).
_AZURE: Final[Mapping[str, tuple[str, int]]] = {
    "standard_nc4as_t4_v3": ("T4", 1),
    "standard_nc8as_t4_v3": ("T4", 1),
    "standard_nc16as_t4_v3": ("T4", 1),
    "standard_nc64as_t4_v3": ("T4", 4),
    "standard_nc6s_v3": ("V100", 1),
    "standard_nc12s_v3": ("V100", 2),
    "standard_nc24s_v3": ("V100", 4),
    "standard_nc24ads_a100_v4": ("A100-80GB", 1),
    "standard_nc48ads_a100_v4": ("A100-80GB", 2),
    "standard_nc96ads_a100_v4": ("A100-80GB", 4),
    "standard_nd96asr_v4": ("A100-40GB", 8),
    "standard_nd96amsr_a100_v4": ("A100-80GB", 8),
    "standard_nd96isr_h100_v5": ("H100", 8),
}

_LOCAL = re.compile(r"^local-(.+?)(?:x(\d+))?$")


def local_instance_type(gpu_type: str, gpu_count: int) -> str:
    """The instance-type name of `gpu_count` GPUs of `gpu_type` on the local machine."""
    return f"local-{gpu_type.lower()}x{gpu_count}"


def _aws_gpus(t: str) -> tuple[str, int] | None:
    family, _, size = t.partition(".")
    gpu_type = _AWS_FAMILY_GPU.get(family)
    count = _AWS_COUNTS.get(family, {}).get(size)
    return None if gpu_type is None or count is None else (gpu_type, count)


def _gcp_gpus(t: str) -> tuple[str, int] | None:
    if m := _GCP_SUFFIX.match(t):
        gpu_type = _GCP_SERIES_GPU.get(m.group(1))
        return None if gpu_type is None else (gpu_type, int(m.group(2)))
    series, _, vcpus = t.rpartition("-")
    by_vcpus = _GCP_BY_VCPUS.get(series)
    if by_vcpus is None or not vcpus.isdigit():
        return None
    count = by_vcpus[1].get(int(vcpus))
    return None if count is None else (by_vcpus[0], count)


def _local_gpus(t: str) -> tuple[str, int] | None:
    if m := _LOCAL.match(t):
        canonical = canonical_gpu_name(m.group(1))
        count = int(m.group(2)) if m.group(2) else 1
        return None if canonical is None or count < 1 else (canonical, count)
    return None


InstanceParser = Callable[[str], "tuple[str, int] | None"]
_LOCK = threading.Lock()
# cloud -> (lower-case instance type -> (GPU type, count) or None)
_PARSERS: dict[str, InstanceParser] = {
    "aws": _aws_gpus,
    "gcp": _gcp_gpus,
    "azure": _AZURE.get,
    "local": _local_gpus,
}


def register_instance_types(cloud: str, parser: InstanceParser) -> None:
    """Teach the catalog a plug-in cloud's instance types: `parser(lower-case type)` gives
    (canonical GPU type, count) or None. The same parser again is a no-op."""
    name = cloud.strip().lower()
    with _LOCK:
        known = _PARSERS.get(name)
        if known is not None and known is not parser:
            raise ValueError(f"cloud {name!r} already has an instance-type table")
        _PARSERS[name] = parser


def instance_gpus(cloud: str, instance_type: str) -> tuple[str, int] | None:
    """(canonical GPU name, GPU count) of an instance type; None when unknown, CPU-only or
    a fraction of a GPU (see FRACTIONAL_GPU_SHAPES).

    >>> instance_gpus("gcp", "a3-highgpu-8g"), instance_gpus("aws", "p3.2xlarge")
    (('H100', 8), ('V100', 1))
    """
    parser = _PARSERS.get(cloud.strip().lower())
    return None if parser is None else parser(instance_type.strip().lower())


# On-demand list prices ($/h, Linux, whole instance), a fallback when a trace has no price.
# AWS: EC2 On-Demand pricing page, us-east-1 (values as in the SkyPilot catalog v8 snapshot,
# after the June 2025 P4/P5 price cuts). GCP: Compute Engine "GPU machine types" pricing
# page, us-central1 (values as in Cyclenerd/google-cloud-pricing-cost-calculator, 2026-07).
LIST_PRICES: Final[Mapping[tuple[str, str], float]] = MappingProxyType(
    {
        ("aws", "p2.xlarge"): 0.90,  # EC2 On-Demand pricing, us-east-1
        ("aws", "g4dn.xlarge"): 0.526,  # EC2 On-Demand pricing, us-east-1
        ("aws", "g5.xlarge"): 1.006,
        ("aws", "g6.xlarge"): 0.8048,
        ("aws", "g6e.2xlarge"): 2.24208,
        ("aws", "p3.2xlarge"): 3.06,
        ("aws", "p3.8xlarge"): 12.24,
        ("aws", "p3.16xlarge"): 24.48,
        ("aws", "p4d.24xlarge"): 21.957642,
        ("aws", "p4de.24xlarge"): 27.44705,
        ("aws", "p5.4xlarge"): 6.88,
        ("aws", "p5.48xlarge"): 55.04,
        ("aws", "p5en.48xlarge"): 63.296,
        ("aws", "p6-b200.48xlarge"): 113.9328,
        ("gcp", "a2-highgpu-1g"): 3.673385,
        ("gcp", "a2-highgpu-8g"): 29.38708,
        ("gcp", "a2-ultragpu-1g"): 5.068798,
        ("gcp", "a2-ultragpu-8g"): 40.550383,
        ("gcp", "a3-highgpu-1g"): 11.06125,
        ("gcp", "a3-highgpu-8g"): 88.49,
        ("gcp", "g2-standard-4"): 0.706832,
        ("gcp", "g2-standard-48"): 4.001665,
        ("gcp", "g4-standard-48"): 4.49993,
    }
)


def on_demand_usd_per_hour(cloud: str, instance_type: str) -> float | None:
    """A documented on-demand list price for the instance type, or None."""
    return LIST_PRICES.get((cloud.strip().lower(), instance_type.strip().lower()))
