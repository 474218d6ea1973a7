"""Shared fixtures: the path to ../shared/data, and small hand-built traces."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.signals.traces import Trace, make_manifest

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def shared_data_dir() -> Path:
    return Path(os.environ.get("HELIOTROPE_TRACES", REPO.parent / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if not (path / "SOURCES.md").is_file():
        pytest.skip(f"shared traces not found at {path} (set HELIOTROPE_TRACES)")
    return path


def tiny_trace(
    *,
    spot_pattern: Sequence[tuple[float, float]] = ((0.0, 1.0),),
    hours: float = 48.0,
    carbon: dict[str, float] | None = None,
) -> Trace:
    """Two zones: aws us-east-1a (V100 p3.2xlarge, on-demand 3.06, spot 0.92) and gcp
    europe-west4-a (A100-80GB a2-ultragpu-1g, on-demand 5.07, spot 1.57).
    `spot_pattern` is (hour, capacity) change points for the AWS spot offer; GCP spot is
    always available. Carbon is constant per zone."""
    carbon = carbon or {"US-MIDA-PJM": 400.0, "NL": 300.0}
    offers = pd.DataFrame(
        [
            {
                "cloud": "aws",
                "region": "us-east-1",
                "zone": "us-east-1a",
                "instance_type": "p3.2xlarge",
                "gpu_type": "V100",
                "gpu_count": 1,
                "grid_zone": "US-MIDA-PJM",
            },
            {
                "cloud": "gcp",
                "region": "europe-west4",
                "zone": "europe-west4-a",
                "instance_type": "a2-ultragpu-1g",
                "gpu_type": "A100-80GB",
                "gpu_count": 1,
                "grid_zone": "NL",
            },
        ]
    )
    prices = pd.DataFrame(
        [
            {
                "time": T0,
                "cloud": "aws",
                "region": "us-east-1",
                "zone": "",
                "instance_type": "p3.2xlarge",
                "market": "on_demand",
                "usd_per_hour": 3.06,
            },
            {
                "time": T0,
                "cloud": "aws",
                "region": "us-east-1",
                "zone": "us-east-1a",
                "instance_type": "p3.2xlarge",
                "market": "spot",
                "usd_per_hour": 0.92,
            },
            {
                "time": T0,
                "cloud": "gcp",
                "region": "europe-west4",
                "zone": "",
                "instance_type": "a2-ultragpu-1g",
                "market": "on_demand",
                "usd_per_hour": 5.07,
            },
            {
                "time": T0,
                "cloud": "gcp",
                "region": "europe-west4",
                "zone": "",
                "instance_type": "a2-ultragpu-1g",
                "market": "spot",
                "usd_per_hour": 1.57,
            },
        ]
    )
    spot = pd.DataFrame(
        [
            {
                "time": T0 + timedelta(hours=h),
                "cloud": "aws",
                "zone": "us-east-1a",
                "instance_type": "p3.2xlarge",
                "capacity": c,
            }
            for h, c in spot_pattern
        ]
        + [
            {
                "time": T0,
                "cloud": "gcp",
                "zone": "europe-west4-a",
                "instance_type": "",
                "capacity": 4.0,
            }
        ]
    )
    grid = pd.DataFrame(
        [
            {
                "time": T0 + timedelta(hours=h),
                "grid_zone": z,
                "metric": "carbon_avg_g_per_kwh",
                "value": v,
                "source": "test",
            }
            for z, v in carbon.items()
            for h in range(int(hours) + 1)
        ]
    )
    return Trace(
        offers=offers,
        prices=prices,
        spot=spot,
        grid=grid,
        manifest=make_manifest(generator="test", start=T0.isoformat()),
    )


@pytest.fixture(scope="module")
def shared_data_module() -> Path:
    path = shared_data_dir()
    if not (path / "SOURCES.md").is_file():
        pytest.skip(f"shared traces not found at {path} (set HELIOTROPE_TRACES)")
    return path
