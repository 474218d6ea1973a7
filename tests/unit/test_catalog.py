"""The catalog of built-in facts: GPU types, instance types, regions, PUE and data transfer."""

from __future__ import annotations

import csv
import gzip
import math
import os
from pathlib import Path

import pytest

from orchestrator import catalog
from orchestrator.catalog import (
    FRACTIONAL_GPU_SHAPES,
    GPUS,
    bandwidth_gbps,
    continent,
    egress_usd_per_gb,
    gpu,
    grid_zone,
    instance_gpus,
    instance_power_kw,
    on_demand_usd_per_hour,
    pue,
    region_of_zone,
    regions,
    transfer_hours,
)
from orchestrator.errors import UnknownNameError
from orchestrator.model import Location

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("HELIOTROPE_TRACES") or REPO.parent / "shared" / "data")
MAPPING_CSV = DATA / "carbon" / "cloud_region_to_grid_zone_mapping.csv"
AWS_PRICES_CSV = DATA / "prices" / "aws_gpu_vm_prices_snapshot_skypilot_v8.csv"
GCP_PRICES_CSV = DATA / "prices" / "gcp_gpu_vm_price_history.csv.gz"


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        pytest.skip(f"{path} is absent (set HELIOTROPE_TRACES to the shared data directory)")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


# --- GPUs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("A100-80GB", "A100-80GB"),
        ("a100-sxm4-80gb", "A100-80GB"),
        ("nvidia-a100-80gb", "A100-80GB"),
        ("a100", "A100-40GB"),
        ("nvidia-tesla-a100", "A100-40GB"),
        ("A100-40GB", "A100-40GB"),
        ("h100", "H100"),
        ("H100-80GB", "H100"),
        ("h100-80gb-mega", "H100"),
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("nvidia-h200-141gb", "H200"),
        ("b200", "B200"),
        ("nvidia-l4", "L4"),
        ("a10g", "A10G"),
        ("l40s", "L40S"),
        ("v100", "V100"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("V100-32GB", "V100-32GB"),
        ("nvidia-tesla-t4", "T4"),
        ("K80", "K80"),
        ("rtx6000", "RTX-PRO-6000"),
        ("rtx_pro_6000", "RTX-PRO-6000"),
    ],
)
def test_gpu_aliases_normalise_case_insensitively(alias: str, canonical: str) -> None:
    assert gpu(alias).name == canonical


def test_required_gpu_types_present_with_sane_specs() -> None:
    required = {"A100-80GB", "A100-40GB", "H100", "H200", "B200", "L4", "A10G", "L40S"}
    required |= {"V100", "T4", "K80", "RTX-PRO-6000"}
    assert required <= set(GPUS)
    for name, spec in GPUS.items():
        assert spec.name == name
        assert spec.board_power_w > 0 and spec.memory_gb > 0 and spec.relative_throughput > 0
    assert GPUS["A100-80GB"].relative_throughput == 1.0


@pytest.mark.parametrize(
    ("name", "power_w", "memory_gb"),
    [("A100-80GB", 400, 80), ("H100", 700, 80), ("H200", 700, 141), ("L4", 72, 24)],
)
def test_gpu_datasheet_figures(name: str, power_w: float, memory_gb: float) -> None:
    assert gpu(name).board_power_w == power_w
    assert gpu(name).memory_gb == memory_gb


def test_throughput_ordering_follows_generations() -> None:
    tp = {n: s.relative_throughput for n, s in GPUS.items()}
    assert tp["K80"] < tp["T4"] < tp["V100"] < tp["A100-40GB"] < tp["A100-80GB"]
    assert tp["A100-80GB"] < tp["H100"] < tp["H200"] < tp["B200"]


def test_unknown_gpu_raises_with_known_list() -> None:
    with pytest.raises(UnknownNameError) as err:
        gpu("TPU-v5e")
    message = str(err.value)
    assert "TPU-v5e" in message
    for name in GPUS:
        assert name in message
    assert set(err.value.known) == set(GPUS)


@pytest.mark.parametrize(
    ("gpu_type", "count", "expected_kw"),
    [
        ("H100", 8, 8 * 0.7 * 1.8 + 0.1),
        ("A100-80GB", 1, 0.4 * 1.8 + 0.1),
        ("L4", 1, 0.072 * 1.8 + 0.1),
        ("T4", 0, 0.1),
    ],
)
def test_instance_power_is_gpus_plus_host(gpu_type: str, count: int, expected_kw: float) -> None:
    assert instance_power_kw(gpu_type, count) == pytest.approx(expected_kw)


def test_instance_power_near_dgx_h100_rating() -> None:
    # NVIDIA DGX H100: about 10.2 kW maximum system power.
    assert instance_power_kw("h100", 8) == pytest.approx(10.2, rel=0.02)


def test_instance_power_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="gpu_count"):
        instance_power_kw("H100", -1)
    with pytest.raises(UnknownNameError):
        instance_power_kw("nope", 1)


# --- instance types ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "instance_type", "expected"),
    [
        ("aws", "p3.2xlarge", ("V100", 1)),
        ("aws", "p3.16xlarge", ("V100", 8)),
        ("aws", "p3dn.24xlarge", ("V100-32GB", 8)),
        ("aws", "p4d.24xlarge", ("A100-40GB", 8)),
        ("aws", "p4de.24xlarge", ("A100-80GB", 8)),
        ("aws", "p5.48xlarge", ("H100", 8)),
        ("aws", "p5en.48xlarge", ("H200", 8)),
        ("aws", "p6-b200.48xlarge", ("B200", 8)),
        ("aws", "g4dn.xlarge", ("T4", 1)),
        ("aws", "g4dn.12xlarge", ("T4", 4)),
        ("aws", "p2.xlarge", ("K80", 1)),
        ("aws", "p2.8xlarge", ("K80", 8)),
        ("aws", "g5.48xlarge", ("A10G", 8)),
        ("aws", "g6e.2xlarge", ("L40S", 1)),
        ("AWS", "P3.2XLARGE", ("V100", 1)),
        ("gcp", "a3-highgpu-8g", ("H100", 8)),
        ("gcp", "a3-megagpu-8g", ("H100", 8)),
        ("gcp", "a2-ultragpu-1g", ("A100-80GB", 1)),
        ("gcp", "a2-highgpu-4g", ("A100-40GB", 4)),
        ("gcp", "a2-megagpu-16g", ("A100-40GB", 16)),
        ("gcp", "g2-standard-4", ("L4", 1)),
        ("gcp", "g2-standard-24", ("L4", 2)),
        ("gcp", "g2-standard-96", ("L4", 8)),
        ("gcp", "g4-standard-48", ("RTX-PRO-6000", 1)),
        ("gcp", "g4-standard-384", ("RTX-PRO-6000", 8)),
        ("azure", "Standard_ND96isr_H100_v5", ("H100", 8)),
        ("local", "local-l4x1", ("L4", 1)),
        ("local", "local-a100-80gbx2", ("A100-80GB", 2)),
        ("local", "local-h100", ("H100", 1)),
        ("local", catalog.local_instance_type("RTX-PRO-6000", 4), ("RTX-PRO-6000", 4)),
    ],
)
def test_instance_gpus(cloud: str, instance_type: str, expected: tuple[str, int]) -> None:
    assert instance_gpus(cloud, instance_type) == expected


@pytest.mark.parametrize(
    ("cloud", "instance_type"),
    [
        ("aws", "r5.16xlarge"),  # CPU only
        ("aws", "p3.4xlarge"),  # no such size
        ("gcp", "c3-highcpu-88"),
        ("gcp", "g4-standard-6"),  # 1/8 GPU
        ("gcp", "n1-standard-8"),
        ("local", "local-cpu"),
        ("ibm", "p3.2xlarge"),
    ],
)
def test_instance_gpus_none_for_unknown_cpu_or_fractional(cloud: str, instance_type: str) -> None:
    assert instance_gpus(cloud, instance_type) is None


def test_list_prices() -> None:
    assert on_demand_usd_per_hour("aws", "p3.2xlarge") == 3.06
    assert on_demand_usd_per_hour("gcp", "a3-highgpu-8g") == pytest.approx(88.49)
    assert on_demand_usd_per_hour("aws", "nope.xlarge") is None
    for (cloud, instance_type), price in catalog.LIST_PRICES.items():
        assert price > 0
        assert instance_gpus(cloud, instance_type) is not None


@pytest.mark.traces
def test_every_aws_snapshot_instance_type_maps() -> None:
    rows = _rows(AWS_PRICES_CSV)
    seen: dict[str, tuple[str, int]] = {}
    for row in rows:
        seen[row["instance_type"]] = (
            gpu(row["accelerator_name"]).name,
            int(row["accelerator_count"]),
        )
    assert len(seen) > 20
    for instance_type, expected in seen.items():
        assert instance_gpus("aws", instance_type) == expected, instance_type


@pytest.mark.traces
def test_every_gcp_price_history_instance_type_maps() -> None:
    rows = _rows(GCP_PRICES_CSV)
    counts: dict[str, float] = {}
    models: dict[str, set[str]] = {}
    for row in rows:
        counts[row["instance_type"]] = float(row["gpu_count"])
        models.setdefault(row["instance_type"], set()).add(row["gpu_model"])
    assert len(counts) >= 29
    for instance_type, count in counts.items():
        got = instance_gpus("gcp", instance_type)
        if count < 1:
            assert got is None
            assert FRACTIONAL_GPU_SHAPES["gcp", instance_type][1] == count
            continue
        assert got is not None, instance_type
        assert got[1] == count, instance_type
        # The source labels some a2-ultragpu rows plain "a100"; every label must at least
        # be an A100 of some size, and the other families must match exactly.
        names = {gpu(m).name for m in models[instance_type]}
        assert got[0] in names, (instance_type, names)


# --- regions, grid zones, PUE -----------------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "region", "zone"),
    [
        ("aws", "us-east-1", "US-MIDA-PJM"),
        ("aws", "us-west-2", "US-NW-BPAT"),
        ("aws", "eu-central-1", "DE"),
        ("aws", "eu-north-1", "SE-SE3"),
        ("aws", "us-east-1a", "US-MIDA-PJM"),
        ("aws", "use1-az4", "US-MIDA-PJM"),
        ("aws", "usw2-az3", "US-NW-BPAT"),
        ("gcp", "us-central1", "US-MIDW-MISO"),
        ("gcp", "us-central1-a", "US-MIDW-MISO"),
        ("gcp", "europe-west4-a", "NL"),
        ("gcp", "europe-north1", "FI"),
        ("gcp", "asia-southeast1-b", "SG"),
        ("gcp", "asia-south2-b", "IN-NO"),
        ("azure", "westus2", "US-NW-GCPD"),
        ("GCP", "US-WEST1-B", "US-NW-BPAT"),
    ],
)
def test_grid_zone(cloud: str, region: str, zone: str) -> None:
    assert grid_zone(cloud, region) == zone


def test_grid_zone_none_for_local_and_unknown() -> None:
    assert grid_zone("local", "local") is None
    assert grid_zone("aws", "mars-north-1") is None
    assert grid_zone("ibm", "us-south") is None


@pytest.mark.parametrize(
    ("cloud", "zone", "region"),
    [
        ("aws", "us-east-1a", "us-east-1"),
        ("aws", "eu-west-2c", "eu-west-2"),
        ("aws", "use1-az1", "us-east-1"),
        ("aws", "use2-az3", "us-east-2"),
        ("aws", "usw1-az1", "us-west-1"),
        ("aws", "euw1-az2", "eu-west-1"),
        ("aws", "apse2-az1", "ap-southeast-2"),
        ("aws", "aps1-az1", "ap-south-1"),
        ("aws", "eus2-az1", "eu-south-2"),
        ("aws", "mec1-az1", "me-central-1"),
        ("aws", "use1-atl2-az1", "us-east-1"),
        ("aws", "us-east-1", "us-east-1"),
        ("gcp", "us-central1-a", "us-central1"),
        ("gcp", "europe-west3-c", "europe-west3"),
        ("gcp", "us-central1", "us-central1"),
        ("local", "local", "local"),
    ],
)
def test_region_of_zone(cloud: str, zone: str, region: str) -> None:
    assert region_of_zone(cloud, zone) == region


@pytest.mark.parametrize(
    ("cloud", "region", "expected"),
    [
        ("aws", "us-east-1", "na"),
        ("aws", "sa-east-1", "sa"),
        ("aws", "eu-west-1", "eu"),
        ("aws", "ap-northeast-1", "asia"),
        ("aws", "ap-southeast-2", "oceania"),
        ("aws", "af-south-1", "africa"),
        ("aws", "me-central-1", "me"),
        ("gcp", "us-central1-c", "na"),
        ("gcp", "me-west1", "me"),
        ("aws", "nowhere-1", "unknown"),
        ("local", "local", "unknown"),
    ],
)
def test_continent(cloud: str, region: str, expected: str) -> None:
    assert continent(cloud, region) == expected


def test_regions_and_pue() -> None:
    assert "us-east-1" in regions("aws")
    assert "us-central1" in regions("gcp")
    assert "eastus" in regions("azure")
    assert regions("local") == ("local",)
    assert pue("aws") == 1.15
    assert pue("GCP") == 1.10
    assert 1.0 < pue("azure") < pue("local")
    for cloud in ("aws", "gcp", "azure"):
        for region in regions(cloud):
            assert grid_zone(cloud, region), (cloud, region)
            assert continent(cloud, region) in catalog.CONTINENTS


@pytest.mark.parametrize("call", [pue, regions])
def test_unknown_cloud_raises(call: object) -> None:
    assert callable(call)
    with pytest.raises(UnknownNameError) as err:
        call("ibm")
    assert "aws" in str(err.value) and "gcp" in str(err.value)


@pytest.mark.traces
def test_every_region_of_the_mapping_csv_is_mapped() -> None:
    rows = _rows(MAPPING_CSV)
    assert len(rows) == 59
    for row in rows:
        assert grid_zone(row["provider"], row["cloud_region"]) == row["em_zone_id"], row


@pytest.mark.traces
def test_every_price_file_region_and_zone_is_known() -> None:
    for row in _rows(AWS_PRICES_CSV):
        assert region_of_zone("aws", row["availability_zone_id"]) == row["region"]
        assert grid_zone("aws", row["availability_zone_id"]) is not None, row["region"]
    for row in _rows(GCP_PRICES_CSV):
        assert grid_zone("gcp", row["region"]) is not None, row["region"]
        assert continent("gcp", row["region"]) != "unknown", row["region"]


@pytest.mark.traces
def test_every_spot_trace_zone_is_mapped() -> None:
    for row in _rows(DATA / "spot" / "spot_traces_metadata.csv"):
        cloud = row["cloud"].lower()
        assert region_of_zone(cloud, row["zone"]) == row["region"]
        assert grid_zone(cloud, row["zone"]) is not None


# --- network ----------------------------------------------------------------------------

AWS_E1A = Location("aws", "us-east-1", "us-east-1a")
AWS_E1B = Location("aws", "us-east-1", "us-east-1b")
AWS_W2 = Location("aws", "us-west-2")
AWS_FRA = Location("aws", "eu-central-1")
GCP_C1 = Location("gcp", "us-central1", "us-central1-a")
GCP_C1B = Location("gcp", "us-central1", "us-central1-b")
GCP_E4 = Location("gcp", "us-east4")
GCP_EW4 = Location("gcp", "europe-west4")
GCP_SG = Location("gcp", "asia-southeast1")
LOCAL = Location("local", "local")
NET = Location("internet", "")


@pytest.mark.parametrize(
    ("src", "dst", "usd_per_gb"),
    [
        (AWS_E1A, AWS_E1A, 0.0),
        (AWS_E1A, Location("aws", "us-east-1"), 0.0),
        (AWS_E1A, AWS_E1B, 0.01),
        (GCP_C1, GCP_C1B, 0.01),
        (AWS_E1A, AWS_W2, 0.02),
        (AWS_E1A, Location("aws", "us-east-2"), 0.01),
        (AWS_E1A, AWS_FRA, 0.02),
        (GCP_C1, GCP_E4, 0.02),
        (GCP_C1, GCP_EW4, 0.05),
        (GCP_C1, GCP_SG, 0.08),
        (AWS_E1A, GCP_C1, 0.09),
        (AWS_E1A, NET, 0.09),
        (GCP_C1, AWS_E1A, 0.12),
        (LOCAL, AWS_E1A, 0.0),
        (LOCAL, LOCAL, 0.0),
        (NET, GCP_C1, 0.0),
    ],
)
def test_egress_usd_per_gb(src: Location, dst: Location, usd_per_gb: float) -> None:
    assert egress_usd_per_gb(src, dst) == pytest.approx(usd_per_gb)


@pytest.mark.parametrize(
    ("same_region", "inter_region", "cross_cloud"),
    [
        (Location("aws", "us-east-1"), AWS_W2, GCP_C1),
        (GCP_C1B, GCP_EW4, AWS_E1A),
        (Location("aws", "sa-east-1", "sa-east-1a"), Location("aws", "us-east-1"), GCP_C1),
        (Location("gcp", "australia-southeast1"), GCP_C1, AWS_E1A),
    ],
)
def test_egress_ordering(
    same_region: Location, inter_region: Location, cross_cloud: Location
) -> None:
    src = Location(same_region.cloud, same_region.region)
    assert (
        egress_usd_per_gb(src, same_region)
        < egress_usd_per_gb(src, inter_region)
        <= egress_usd_per_gb(src, cross_cloud)
    )


def test_egress_unknown_cloud_raises() -> None:
    with pytest.raises(UnknownNameError):
        egress_usd_per_gb(Location("ibm", "us-south"), AWS_E1A)


def test_bandwidth_ordering() -> None:
    same = bandwidth_gbps(AWS_E1A, AWS_E1B)
    cross_region = bandwidth_gbps(AWS_E1A, AWS_W2)
    cross_cloud = bandwidth_gbps(AWS_E1A, GCP_C1)
    cross_continent = bandwidth_gbps(AWS_E1A, GCP_EW4)
    assert same > cross_region > cross_cloud > cross_continent > 0
    assert bandwidth_gbps(LOCAL, AWS_E1A) > 0


@pytest.mark.parametrize(
    ("size_gb", "src", "dst"),
    [
        (50.0, AWS_E1A, AWS_W2),
        (1000.0, GCP_C1, GCP_EW4),
        (3.5, AWS_E1A, GCP_C1),
        (0.0, GCP_C1, GCP_SG),
        (10.0, LOCAL, AWS_E1A),
    ],
)
def test_transfer_hours_math(size_gb: float, src: Location, dst: Location) -> None:
    expected = size_gb * 8 / bandwidth_gbps(src, dst) / 3600
    assert transfer_hours(size_gb, src, dst) == pytest.approx(expected)


def test_transfer_hours_examples() -> None:
    # 50 GB at 5 Gbit/s: 400 Gbit / 5 = 80 s.
    assert transfer_hours(50.0, AWS_E1A, AWS_W2) == pytest.approx(80 / 3600)
    assert transfer_hours(500.0, AWS_E1A, AWS_E1B) == 0.0
    assert transfer_hours(500.0, GCP_C1, Location("gcp", "us-central1")) == 0.0
    assert transfer_hours(500.0, LOCAL, LOCAL) == 0.0
    assert math.isfinite(transfer_hours(1e6, AWS_E1A, NET))
    with pytest.raises(ValueError, match="size_gb"):
        transfer_hours(-1.0, AWS_E1A, AWS_W2)
