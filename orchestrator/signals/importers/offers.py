"""The offers table from the importers' offer candidates.

A candidate is (cloud, region, zone, instance_type) plus the dataset's own GPU description.
Rules:

- one offer per (cloud, zone, instance_type); the first candidate wins (dataset order);
- a region-level candidate (``zone == region``, from the GCP price history, which names no
  zones) is replaced by the zone-level candidates of the same (cloud, region, instance_type)
  where a spot trace names such zones; it is never invented as ``f"{region}-a"``;
- GPU type and count come from the catalog (`instance_gpus`); where the catalog does not know
  the instance type, from the dataset's GPU name (normalised by `canonical_gpu_name`) and count;
  a candidate with no known GPU is dropped with a note;
- ``grid_zone`` is the catalog's zone for the region ('' where unknown).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from orchestrator import catalog
from orchestrator.signals.traces import COLUMNS


def _gpu(cloud: str, instance_type: str, name: str, count: float) -> tuple[str, int] | None:
    known = catalog.instance_gpus(cloud, instance_type)
    if known is not None:
        return known
    if (cloud, instance_type) in catalog.FRACTIONAL_GPU_SHAPES:
        return None  # a slice of a GPU: not usable for a training gang
    gpu = catalog.canonical_gpu_name(name) if name else None
    if gpu is None or math.isnan(count) or count < 1:
        return None
    return gpu, int(count)


def build_offers(candidates: pd.DataFrame, notes: list[str]) -> pd.DataFrame:
    cand = candidates.drop_duplicates(["cloud", "zone", "instance_type"], keep="first")
    region_level = (cand["zone"] == cand["region"]).to_numpy()
    keys = ["cloud", "region", "instance_type"]
    zonal_keys = pd.MultiIndex.from_frame(cand.loc[~region_level, keys])
    replaced = region_level & pd.MultiIndex.from_frame(cand[keys]).isin(zonal_keys)
    cand = cand[~replaced]

    types = cand.drop_duplicates(["cloud", "instance_type"])
    gpus = {
        (c, t): _gpu(c, t, n, float(h))
        for c, t, n, h in zip(
            types["cloud"],
            types["instance_type"],
            types["gpu_name"],
            types["gpu_count_hint"],
            strict=True,
        )
    }
    unknown = sorted(f"{c}/{t}" for (c, t), g in gpus.items() if g is None)
    if unknown:
        notes.append(f"Offers: instance types without a known GPU dropped: {', '.join(unknown)}.")
    pairs = list(zip(cand["cloud"], cand["instance_type"], strict=True))
    found = np.array([gpus[p] is not None for p in pairs], dtype=bool)
    cand = cand[found]
    specs = [gpus[p] for p in pairs if gpus[p] is not None]
    regions = {
        (c, r): catalog.grid_zone(c, r) or ""
        for c, r in set(zip(cand["cloud"], cand["region"], strict=True))
    }
    offers = pd.DataFrame(
        {
            "cloud": cand["cloud"].to_numpy(),
            "region": cand["region"].to_numpy(),
            "zone": cand["zone"].to_numpy(),
            "instance_type": cand["instance_type"].to_numpy(),
            "gpu_type": [s[0] for s in specs if s is not None],
            "gpu_count": np.array([s[1] for s in specs if s is not None], dtype=np.int64),
            "grid_zone": [
                regions[(c, r)] for c, r in zip(cand["cloud"], cand["region"], strict=True)
            ],
        }
    )
    no_zone = sorted({f"{c}/{r}" for (c, r), z in regions.items() if not z})
    if no_zone:
        notes.append(
            f"Offers: regions without a known grid zone (grid_zone ''): {', '.join(no_zone)}."
        )
    n_region = int((offers["zone"] == offers["region"]).sum())
    notes.append(
        f"Offers: {len(offers)} (cloud, zone, instance type) rows; {n_region} are region-level "
        "GCP offers (zone = region, no zone named by any source); "
        f"{int(replaced.sum())} region-level candidates replaced by zones named in spot traces."
    )
    return offers.sort_values(["cloud", "region", "zone", "instance_type"]).reset_index(drop=True)[
        list(COLUMNS["offers"])
    ]
