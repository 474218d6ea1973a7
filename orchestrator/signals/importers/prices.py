"""GPU VM prices: the GCP price history (a change log per region) and the AWS snapshot.

GCP (``prices/gcp_gpu_vm_price_history.csv.gz``): region-level rows (zone ``''``, every
zone of the region) at ``valid_from_utc``, both markets. Spot prices are empty before
2023-05-08 (the source had none yet): those rows are skipped, not written as NaN. A machine
type that disappears from the price pages before the last snapshot gets a NaN row for both
markets at the first snapshot that no longer listed it (an explicit end). Offers: one per
(region, machine type) with ``zone = region`` (a region-level offer; the file names no
zones); `offers.build_offers` replaces it by zone-level offers where a spot trace names zones
of that region for that machine type.

AWS (``prices/aws_gpu_vm_prices_snapshot_skypilot_v8.csv``): one catalog snapshot without a
date (late 2025 or 2026). It is written at `AWS_SNAPSHOT_TIME` (2020-01-01T00:00Z, "valid
from the start") so that it prices every replay window: the assumption is that list prices
are constant. Spot prices per availability-zone id; on-demand prices, which AWS sets per
region (they agree across the zones of every region in the file), as region-level rows so
that zones named by the spot traces (``us-east-1a``, a per-account name that cannot be mapped
to a zone id) get an on-demand price too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from orchestrator.signals.importers._common import (
    CANDIDATE_COLUMNS,
    Loaded,
    Part,
    SourceFile,
    importer,
    price_log,
    table,
)

GCP_HISTORY: Final = Path("prices/gcp_gpu_vm_price_history.csv.gz")
GCP_SNAPSHOTS: Final = Path("prices/gcp_price_snapshots_index.csv")
AWS_SNAPSHOT: Final = Path("prices/aws_gpu_vm_prices_snapshot_skypilot_v8.csv")
AWS_SNAPSHOT_TIME: Final = pd.Timestamp("2020-01-01T00:00:00Z")

_GCP_HISTORY: Final = SourceFile(
    GCP_HISTORY,
    "gcp_gpu_vm_price_history",
    "Apache-2.0",
    "Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml, 290 versions "
    "d4890e9..fd66b26 (Google Cloud Billing Catalog)",
    (
        "valid_from_utc",
        "last_observed_utc",
        "instance_type",
        "gpu_model",
        "gpu_count",
        "region",
        "ondemand_usd_per_hour",
        "spot_usd_per_hour",
    ),
)
_GCP_SNAPSHOTS: Final = SourceFile(
    GCP_SNAPSHOTS,
    "gcp_price_snapshots_index",
    "Apache-2.0",
    "Cyclenerd/google-cloud-pricing-cost-calculator (pricing.yml commits)",
    ("snapshot_utc",),
)
_AWS_SNAPSHOT: Final = SourceFile(
    AWS_SNAPSHOT,
    "aws_gpu_vm_prices_snapshot_skypilot_v8",
    "no LICENSE file in the repository; AWS public list and Spot prices",
    "skypilot-org/skypilot-catalog catalogs/v8/aws/vms.csv @00148f2",
    (
        "instance_type",
        "accelerator_name",
        "accelerator_count",
        "ondemand_usd_per_hour",
        "spot_usd_per_hour",
        "region",
        "availability_zone_id",
    ),
)


def _market_rows(frame: pd.DataFrame, value: str, market: str) -> pd.DataFrame:
    """Rows of one market from a per-(instance_type, region) time-sorted frame: empty values
    before the first price are skipped (the market did not exist yet); later empty values are
    kept as NaN (the price ended)."""
    started = (
        frame[value].notna().groupby([frame["instance_type"], frame["region"]], sort=False).cummax()
    )
    rows = frame[started.to_numpy()]
    return table(
        "prices",
        time=rows["time"],
        cloud="gcp",
        region=rows["region"],
        zone="",
        instance_type=rows["instance_type"],
        market=market,
        usd_per_hour=rows[value],
    )


def _snapshot_times(part: Part, data_dir: Path, frame: pd.DataFrame) -> npt.NDArray[np.int64]:
    """Times (ns, sorted, distinct) at which the price pages were observed: the index file,
    plus every time named in the history itself (each is a snapshot time)."""
    snap_times = pd.concat([frame["time"], frame["last_seen"]])
    if (data_dir / GCP_SNAPSHOTS).is_file():
        index = _GCP_SNAPSHOTS.read(data_dir)
        snap_times = pd.concat([snap_times, index.utc("snapshot_utc")])
        part.cite(data_dir, index)
    else:
        part.notes.append(
            f"{GCP_SNAPSHOTS} missing: the end of a withdrawn GCP machine type "
            "is placed at the next time named in the price history instead."
        )
    return np.unique(snap_times.dt.as_unit("ns").astype("int64").to_numpy())


def _withdrawn(frame: pd.DataFrame, snaps: npt.NDArray[np.int64]) -> pd.DataFrame:
    """A NaN row for both markets at the first snapshot after a (machine type, region) was
    last seen, for those gone before the last snapshot."""
    last_seen = frame.groupby(["instance_type", "region"], sort=False)["last_seen"].max()
    final = pd.Timestamp(int(snaps[-1]), unit="ns", tz="UTC") if len(snaps) else None
    ended = last_seen[last_seen < final] if final is not None else last_seen.iloc[:0]
    next_idx = np.searchsorted(
        snaps, ended.dt.as_unit("ns").astype("int64").to_numpy(), side="right"
    )
    return pd.DataFrame(
        {
            "time": pd.to_datetime(snaps[next_idx], utc=True),
            "instance_type": ended.index.get_level_values("instance_type"),
            "region": ended.index.get_level_values("region"),
            "on_demand": np.nan,
            "spot": np.nan,
        }
    )


@importer("gcp_prices", _GCP_HISTORY)
def import_gcp_prices(part: Part, data_dir: Path, f: Loaded) -> None:
    frame = pd.DataFrame(
        {
            "time": f.utc("valid_from_utc"),
            "last_seen": f.utc("last_observed_utc"),
            "instance_type": f.text("instance_type"),
            "region": f.text("region"),
            "gpu_model": f.optional_text("gpu_model"),
            "gpu_count": f.number("gpu_count"),
            "on_demand": f.number("ondemand_usd_per_hour"),
            "spot": f.number("spot_usd_per_hour"),
        }
    ).sort_values(["instance_type", "region", "time"], kind="stable")
    ends = _withdrawn(frame, _snapshot_times(part, data_dir, frame))
    with_ends = pd.concat(
        [frame.drop(columns=["last_seen", "gpu_model", "gpu_count"]), ends], ignore_index=True
    )
    with_ends = with_ends.sort_values(["instance_type", "region", "time"], kind="stable")
    part.prices = price_log(
        [
            _market_rows(with_ends, "on_demand", "on_demand"),
            _market_rows(with_ends, "spot", "spot"),
        ]
    )
    if len(ends):
        part.notes.append(
            f"GCP prices: {len(ends)} (machine type, region) pairs disappear from the price "
            "pages before the last snapshot; a NaN row for both markets at the first snapshot "
            "without them ends their prices."
        )

    last = frame.groupby(["region", "instance_type"], sort=True).last().reset_index()
    part.offers = pd.DataFrame(
        {
            "cloud": "gcp",
            "region": last["region"],
            "zone": last["region"],
            "instance_type": last["instance_type"],
            "gpu_name": last["gpu_model"],
            "gpu_count_hint": last["gpu_count"],
        }
    )[list(CANDIDATE_COLUMNS)]
    part.notes.append(
        "GCP prices are region-level (zone ''); the history names no zones. GCP offers are "
        "region-level (zone = region) except where a spot trace names zones of the region for "
        "the same machine type; spot prices start 2023-05-08 (empty before, not written)."
    )


def _aws_rows(frame: pd.DataFrame, zone: pd.Series | str, market: str, col: str) -> pd.DataFrame:
    return table(
        "prices",
        time=AWS_SNAPSHOT_TIME,
        cloud="aws",
        region=frame["region"],
        zone=zone,
        instance_type=frame["instance_type"],
        market=market,
        usd_per_hour=frame[col],
    )


@importer("aws_prices", _AWS_SNAPSHOT)
def import_aws_prices(part: Part, data_dir: Path, f: Loaded) -> None:
    frame = pd.DataFrame(
        {
            "instance_type": f.text("instance_type"),
            "gpu_name": f.optional_text("accelerator_name"),
            "gpu_count_hint": f.number("accelerator_count"),
            "on_demand": f.number("ondemand_usd_per_hour"),
            "spot": f.number("spot_usd_per_hour"),
            "region": f.text("region"),
            "zone": f.text("availability_zone_id"),
        }
    )
    od = frame.dropna(subset=["on_demand"])
    n_values = od.groupby(["region", "instance_type"])["on_demand"].transform("nunique")
    regional = od[n_values == 1].drop_duplicates(["region", "instance_type"])
    zonal = od[n_values > 1]
    spot = frame.dropna(subset=["spot"])
    part.prices = pd.concat(
        [
            _aws_rows(regional, "", "on_demand", "on_demand"),
            _aws_rows(zonal, zonal["zone"], "on_demand", "on_demand"),
            _aws_rows(spot, spot["zone"], "spot", "spot"),
        ],
        ignore_index=True,
    )
    part.offers = pd.DataFrame(
        {
            "cloud": "aws",
            "region": frame["region"],
            "zone": frame["zone"],
            "instance_type": frame["instance_type"],
            "gpu_name": frame["gpu_name"],
            "gpu_count_hint": frame["gpu_count_hint"],
        }
    )[list(CANDIDATE_COLUMNS)]
    n_equal = int(np.isclose(frame["spot"], frame["on_demand"], rtol=1e-4, atol=0.0).sum())
    part.notes.append(
        "AWS prices are a single undated catalog snapshot (late 2025 or 2026) assumed constant: "
        f"written at {AWS_SNAPSHOT_TIME.isoformat()} so that every replay window is priced. "
        "Spot prices per availability-zone id; on-demand prices region-level (zone ''), "
        f"equal across zones in the file. {n_equal} rows have spot equal to on-demand (within "
        "0.01 %: usually no spot capacity, or a price at the cap); kept as published."
    )
