"""Importers: every dataset of the shared data directory (``../shared/data``, described in its
SOURCES.md) into one trace (`orchestrator.signals.traces.Trace`).

`import_shared_data(data_dir)` runs one importer per dataset (modules by source family:
`prices`, `spot`, `carbon`, `power`), merges their rows, resolves overlaps between sources of
the same grid series (earlier datasets in `DATASETS` win) and builds the offers table
(`offers.build_offers`). A missing dataset file is skipped with a note in the manifest; a
malformed one raises `InputError` naming the file and column. docs/traces.md documents the
mapping and every assumption.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pandas as pd

from orchestrator.errors import InputError
from orchestrator.signals.importers import carbon, power, prices, spot
from orchestrator.signals.importers._common import Importer, Part, drop_covered
from orchestrator.signals.importers.offers import build_offers
from orchestrator.signals.traces import COLUMNS, Trace, make_manifest

__all__ = ["DATASETS", "Dataset", "import_shared_data"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Dataset:
    """One dataset: a progress label and its importer, whose files (relative to the data
    directory) must all exist, else it is skipped."""

    label: str
    run: Importer

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(f.path for f in self.run.files)


# Order matters: for the same grid zone and metric, a dataset earlier in this list wins
# where both have a sample (Electricity Maps hourly > EIA-930 > Let's Wait Awhile; EM yearly >
# GCP yearly); for offers, the first candidate of a (cloud, zone, instance type) wins.
DATASETS: Final[tuple[Dataset, ...]] = (
    Dataset("GCP price history", prices.import_gcp_prices),
    Dataset("AWS price snapshot", prices.import_aws_prices),
    Dataset("Spot traces (Can't Be Late, SpotHedge)", spot.import_spot_segments),
    Dataset("Spot instance counts (Bamboo, Parcae)", spot.import_instance_counts),
    Dataset("SkyNomad GCP H100 availability", spot.import_skynomad_gcp),
    Dataset("SkyNomad AWS V100 spot prices", spot.import_skynomad_aws_prices),
    Dataset("Electricity Maps hourly carbon", carbon.import_electricitymaps_hourly),
    Dataset("EIA-930 hourly carbon", carbon.import_eia930),
    Dataset("Let's Wait Awhile carbon", carbon.import_letswaitawhile),
    Dataset("Electricity Maps yearly carbon", carbon.import_electricitymaps_yearly),
    Dataset("GCP region yearly carbon", carbon.import_gcp_yearly),
    Dataset("CAISO curtailment", power.import_caiso_curtailment),
    Dataset("Wholesale power prices (USD)", power.import_wholesale_usd),
    Dataset("GB wholesale power prices (EUR)", power.import_gb_prices),
)

NOT_IMPORTED: Final = (
    "Not imported as signals: carbon/cloud_region_to_grid_zone_mapping.csv (transcribed into "
    "orchestrator.catalog), carbon/electricitymaps_hourly_ci_16zones_zone_list.csv (its "
    "folder -> zone ids are the wholesale price zone mapping), "
    "spot/skynomad_aws_v100_spot_price_archive_summary.csv (a summary of the per-tick file), "
    "anchors/ (SkyNomad paper results, used by replay tests, not signals)."
)

_KEYS: Final = {
    "prices": ["time", "cloud", "region", "zone", "instance_type", "market"],
    "spot": ["time", "cloud", "zone", "instance_type"],
    "grid": ["time", "grid_zone", "metric"],
}


def _resolve_grid(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate grid frames in priority order, dropping rows of a later frame where an
    earlier one has a sample of the same (grid_zone, metric) less than an hour before."""
    kept: list[pd.DataFrame] = []
    for frame in frames:
        if frame.empty:
            continue
        higher = [
            k[
                k["metric"].isin(frame["metric"].unique())
                & k["grid_zone"].isin(frame["grid_zone"].unique())
            ]
            for k in kept
        ]
        higher = [h for h in higher if not h.empty]
        kept.append(drop_covered(frame, pd.concat(higher, ignore_index=True)) if higher else frame)
    if not kept:
        return pd.DataFrame({c: [] for c in COLUMNS["grid"]})
    return pd.concat(kept, ignore_index=True)


def _finish(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    frame = frame.drop_duplicates(_KEYS[table], keep="first")
    frame = frame.assign(time=pd.to_datetime(frame["time"], utc=True).dt.as_unit("ns"))
    return frame.sort_values(["time", *_KEYS[table][1:]], kind="stable").reset_index(drop=True)


def _coverage(parts: list[Part]) -> dict[str, dict[str, str]]:
    """First and last row time of each imported dataset: the windows a replay can use."""
    out: dict[str, dict[str, str]] = {}
    for part in parts:
        times = [f["time"] for f in (part.prices, part.spot, part.grid) if len(f)]
        if times:
            out[part.name] = {
                "start": min(pd.Timestamp(t.min()) for t in times).isoformat(),
                "end": max(pd.Timestamp(t.max()) for t in times).isoformat(),
            }
    return out


def import_shared_data(data_dir: Path, *, progress: Callable[[str], None] | None = None) -> Trace:
    """Convert every dataset under `data_dir` into one `Trace` (not written; see
    `write_trace`). `progress` is called with a short label before each dataset."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(
            str(data_dir),
            "",
            "the shared data directory (with SOURCES.md)",
            got="no such directory",
            fix="pass the path of ../shared/data or set HELIOTROPE_TRACES",
        )
    parts: list[Part] = []
    notes: list[str] = []
    for dataset in DATASETS:
        if progress is not None:
            progress(dataset.label)
        missing = [str(f) for f in dataset.files if not (data_dir / f).is_file()]
        if missing:
            notes.append(f"{dataset.label}: skipped, missing {', '.join(missing)}.")
            logger.info("import: %s skipped, missing %s", dataset.label, missing)
            continue
        part = dataset.run(data_dir)
        logger.info(
            "import: %s: %d prices, %d spot, %d grid rows",
            dataset.label,
            len(part.prices),
            len(part.spot),
            len(part.grid),
        )
        parts.append(part)
    if not parts:
        raise InputError(
            str(data_dir),
            "",
            "at least one dataset described in SOURCES.md",
            got="none of the known files",
            fix="point at the shared data directory itself",
        )
    if progress is not None:
        progress("Merging")
    for part in parts:
        notes.extend(part.notes)
    notes.append(NOT_IMPORTED)
    offers = build_offers(pd.concat([p.offers for p in parts], ignore_index=True), notes)
    price_rows = _finish(pd.concat([p.prices for p in parts], ignore_index=True), "prices")
    spot_rows = _finish(pd.concat([p.spot for p in parts], ignore_index=True), "spot")
    grid_rows = _finish(_resolve_grid([p.grid for p in parts]), "grid")
    sources: list[Mapping[str, Any]] = [s for p in parts for s in p.sources]
    manifest = make_manifest(
        generator="import", sources=sources, notes=notes, coverage=_coverage(parts)
    )
    return Trace(
        offers=offers, prices=price_rows, spot=spot_rows, grid=grid_rows, manifest=manifest
    )
