"""GPU types: board power, memory and training throughput relative to one A100-80GB.

Throughput is the default of the per-GPU-type column of Gavel's throughput matrix
(Narayanan et al., "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads", OSDI'20): how many reference GPU-hours (hours of one A100-80GB) one hour on this
GPU is worth. Real speedups depend on the model; a job may override them
(`JobSpec.throughput`). Values marked "estimate" come from datasheet compute and memory
bandwidth, not a published end-to-end benchmark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from orchestrator.errors import UnknownNameError


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type. `board_power_w` is the TDP / maximum board power of the variant that
    the clouds sell (SXM where they sell SXM); `memory_gb` is per GPU."""

    name: str
    board_power_w: float
    relative_throughput: float
    memory_gb: float


_SPECS: Final[tuple[GpuSpec, ...]] = (
    # A100 SXM4 80GB: 400 W, 80 GB HBM2e (NVIDIA A100 Tensor Core GPU datasheet).
    # Reference GPU by definition: throughput 1.0.
    GpuSpec("A100-80GB", 400.0, 1.0, 80.0),
    # A100 SXM4 40GB: 400 W, 40 GB HBM2 (NVIDIA A100 datasheet). Same 312 TFLOPS BF16 but
    # 1,555 vs 2,039 GB/s memory bandwidth (same datasheet): estimate 0.9.
    GpuSpec("A100-40GB", 400.0, 0.9, 40.0),
    # H100 SXM5: 700 W, 80 GB HBM3 (NVIDIA H100 Tensor Core GPU datasheet). About 2.5x an
    # A100 per GPU on LLM/BERT training in MLPerf Training v3.0 (2023, NVIDIA submissions).
    GpuSpec("H100", 700.0, 2.5, 80.0),
    # H200 SXM: 700 W, 141 GB HBM3e (NVIDIA H200 datasheet). Up to 1.14x H100 on MLPerf
    # Training v4.0 Llama 2 70B LoRA (NVIDIA technical blog, June 2024): 2.5 * 1.12.
    GpuSpec("H200", 700.0, 2.8, 141.0),
    # B200 (HGX): 1,000 W (NVIDIA HGX B200 specifications), 180 GB HBM3e per GPU (AWS P6-B200
    # page: 8 GPUs, 1,440 GB). Up to 2.2x H100 per GPU on GPT-3 175B pre-training in MLPerf
    # Training v4.1 (NVIDIA technical blog, Nov 2024): 2.5 * 2.2.
    GpuSpec("B200", 1000.0, 5.5, 180.0),
    # B300 (HGX, Blackwell Ultra): 1,100 W, 288 GB HBM3e (NVIDIA HGX B300 specifications).
    # Estimate: 1.2x B200, after NVIDIA's MLPerf Training v5.1 blog (Nov 2025).
    GpuSpec("B300", 1100.0, 6.6, 288.0),
    # L4: 72 W, 24 GB GDDR6, 121 TFLOPS FP16 dense, 300 GB/s (NVIDIA L4 datasheet). Estimate.
    GpuSpec("L4", 72.0, 0.2, 24.0),
    # A10G (AWS G5): 24 GB (AWS EC2 G5 page); power cap 300 W as reported by nvidia-smi on
    # g5 instances (NVIDIA's PCIe A10 datasheet lists 150 W; we keep the larger cap).
    # ~125 TFLOPS FP16 dense, 600 GB/s like the A10 (NVIDIA A10 datasheet). Estimate.
    GpuSpec("A10G", 300.0, 0.3, 24.0),
    # L40S: 350 W, 48 GB GDDR6, 362 TFLOPS FP16 dense, 864 GB/s (NVIDIA L40S datasheet).
    # Estimate.
    GpuSpec("L40S", 350.0, 0.6, 48.0),
    # V100 SXM2 16GB: 300 W (NVIDIA V100 datasheet). A100 is 2-2.5x V100 per GPU in MLPerf
    # Training v0.7 (2020) and the NVIDIA A100 architecture whitepaper: 0.9 / 2.25.
    GpuSpec("V100", 300.0, 0.4, 16.0),
    # V100 SXM2 32GB (AWS p3dn): 300 W, 32 GB (NVIDIA V100 datasheet; AWS EC2 P3 page).
    GpuSpec("V100-32GB", 300.0, 0.4, 32.0),
    # P100 PCIe 16GB: 250 W (NVIDIA Tesla P100 datasheet). Gavel (OSDI'20) measures V100
    # about 1.5-2x P100 across its models: 0.4 / 1.8.
    GpuSpec("P100", 250.0, 0.22, 16.0),
    # T4: 70 W, 16 GB GDDR6, 65 TFLOPS FP16, 320 GB/s (NVIDIA T4 datasheet). Estimate.
    GpuSpec("T4", 70.0, 0.14, 16.0),
    # K80: one of the two GK210 GPUs of a K80 board (what AWS p2 counts as one GPU): half of
    # the 300 W board, 12 of 24 GB (NVIDIA Tesla K80 datasheet; AWS EC2 P2 page). Gavel
    # (OSDI'20) measures V100 about 3-10x K80 across its models: 0.4 / 6.
    GpuSpec("K80", 150.0, 0.07, 12.0),
    # RTX PRO 6000 Blackwell Server Edition (GCP G4): up to 600 W, 96 GB GDDR7, 1.6 TB/s
    # (NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet). Estimate.
    GpuSpec("RTX-PRO-6000", 600.0, 0.8, 96.0),
)

GPUS: Final[Mapping[str, GpuSpec]] = MappingProxyType({s.name: s for s in _SPECS})

# Other spellings -> canonical name, keyed by `_key(alias)` (lower case, "-" separators,
# without a leading "nvidia-" or "tesla-"). Sources of the spellings: AWS instance type pages
# and the SkyPilot catalog (A100 = 40 GB on p4d), GCP accelerator names
# (nvidia-tesla-a100 = 40 GB, nvidia-a100-80gb, nvidia-h100-80gb, nvidia-h100-mega-80gb,
# nvidia-h200-141gb, nvidia-l4, nvidia-rtx-pro-6000 ...) and nvidia-smi product names.
_ALIASES: Final[Mapping[str, str]] = {
    "a100-80gb": "A100-80GB",
    "a100-80g": "A100-80GB",
    "a100-80": "A100-80GB",
    "a100-sxm4-80gb": "A100-80GB",
    "a100-sxm-80gb": "A100-80GB",
    "a100-80gb-sxm": "A100-80GB",
    "a100-pcie-80gb": "A100-80GB",
    "a100": "A100-40GB",  # AWS p4d and GCP nvidia-tesla-a100 are the 40 GB part
    "a100-40gb": "A100-40GB",
    "a100-40g": "A100-40GB",
    "a100-sxm4-40gb": "A100-40GB",
    "a100-pcie-40gb": "A100-40GB",
    "h100": "H100",
    "h100-80gb": "H100",
    "h100-sxm": "H100",
    "h100-sxm5": "H100",
    "h100-sxm5-80gb": "H100",
    "h100-80gb-hbm3": "H100",
    "h100-mega": "H100",
    "h100-mega-80gb": "H100",  # GCP a3-megagpu: H100 SXM with more GPU-to-GPU networking
    "h100-80gb-mega": "H100",
    "h200": "H200",
    "h200-141gb": "H200",
    "h200-sxm": "H200",
    "h200-sxm-141gb": "H200",
    "b200": "B200",
    "b200-180gb": "B200",
    "b300": "B300",
    "b300-288gb": "B300",
    "l4": "L4",
    "l4-24gb": "L4",
    "a10g": "A10G",
    "l40s": "L40S",
    "l40s-48gb": "L40S",
    "v100": "V100",
    "v100-16gb": "V100",
    "v100-sxm2": "V100",
    "v100-sxm2-16gb": "V100",
    "v100-32gb": "V100-32GB",
    "v100-sxm2-32gb": "V100-32GB",
    "p100": "P100",
    "p100-16gb": "P100",
    "t4": "T4",
    "t4-16gb": "T4",
    "k80": "K80",
    "rtx-pro-6000": "RTX-PRO-6000",
    "rtx-pro-6000-blackwell": "RTX-PRO-6000",
    "rtx-pro-6000-blackwell-server-edition": "RTX-PRO-6000",
    "rtx6000": "RTX-PRO-6000",  # GCP billing catalog name for the G4 GPU (not Quadro RTX 6000)
}


def _key(name: str) -> str:
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    for prefix in ("nvidia-", "tesla-"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key


_LOOKUP: Final[Mapping[str, str]] = {
    **{_key(name): name for name in GPUS},
    **_ALIASES,
}


def canonical_gpu_name(name: str) -> str | None:
    """The canonical GPU name for `name` or one of its aliases (any case), else None."""
    return _LOOKUP.get(_key(name))


def gpu(name: str) -> GpuSpec:
    """The spec of a GPU type, by canonical name or alias, case-insensitively.

    >>> gpu("nvidia-tesla-v100").name
    'V100'
    """
    canonical = canonical_gpu_name(name)
    if canonical is None:
        raise UnknownNameError("GPU type", name, list(GPUS))
    return GPUS[canonical]


# Host overhead: everything in an instance other than its GPUs (CPUs, memory, NICs, NVSwitch,
# fans, power conversion). Calibrated on NVIDIA's maximum system power of 8-GPU servers:
# DGX A100 6.5 kW (8 x 400 W GPUs), DGX H100 10.2 kW (8 x 700 W), DGX B200 14.3 kW
# (8 x 1,000 W) (NVIDIA DGX A100 / H100 / B200 datasheets and user guides). A fixed
# 0.1 kW per instance plus 0.8 W per GPU watt gives 5.9, 10.2 and 14.5 kW for those servers;
# for a one-GPU L4 VM it gives 0.23 kW. These are near-maximum figures, so energy and carbon
# estimates err on the high side.
HOST_BASE_KW: Final = 0.1
HOST_PER_GPU_WATT: Final = 0.8


def instance_power_kw(gpu_type: str, gpu_count: int) -> float:
    """IT power (kW) of one instance under load: its GPUs at board power plus host overhead.

    >>> round(instance_power_kw("H100", 8), 2)
    10.18
    """
    if gpu_count < 0:
        raise ValueError(f"gpu_count must be >= 0, got {gpu_count}")
    gpus_kw = gpu(gpu_type).board_power_w * gpu_count / 1000.0
    return gpus_kw * (1.0 + HOST_PER_GPU_WATT) + HOST_BASE_KW
