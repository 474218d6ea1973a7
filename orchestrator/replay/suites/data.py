"""Shared-data helpers of the suites: a required file, yearly carbon, change rows."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import pandas as pd

from orchestrator.errors import InputError
from orchestrator.signals.traces import empty_frame


def require(data_dir: Path, rel: str) -> Path:
    path = data_dir / rel
    if not path.is_file():
        raise InputError(
            str(path),
            "",
            "the shared data file",
            got="missing",
            fix="point --data-dir (or HELIOTROPE_TRACES) at ../shared/data",
        )
    return path


def yearly_carbon(data_dir: Path, zones: Iterable[str], year: int, at: datetime) -> pd.DataFrame:
    """Electricity Maps yearly life-cycle averages of `zones`, as grid samples at `at`."""
    path = data_dir / "carbon" / "electricitymaps_yearly_zone_averages_2021_2025.csv"
    if not path.is_file():
        return empty_frame("grid")
    raw = pd.read_csv(path)
    raw = raw[raw["year"] == year]
    table = dict(
        zip(
            raw["zone_id"].astype(str).tolist(),
            raw["ci_lca_gco2eq_per_kwh"].astype(float).tolist(),
            strict=True,
        )
    )
    rows = [
        {
            "time": at,
            "grid_zone": z,
            "metric": "carbon_avg_yearly_g_per_kwh",
            "value": table[z],
            "source": f"electricitymaps yearly {year}",
        }
        for z in sorted(set(zones))
        if z in table
    ]
    return pd.DataFrame(rows) if rows else empty_frame("grid")


def changes(frame: pd.DataFrame, key: str, value: str) -> pd.DataFrame:
    """Rows of `frame` (sorted by time within `key`) where `value` changes."""
    prev = frame.groupby(key, sort=False)[value].shift()
    return frame[prev.isna() | (prev != frame[value])]
