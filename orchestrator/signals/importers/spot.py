"""Spot capacity and per-zone spot prices from the published spot traces.

- Can't Be Late / SpotHedge run-length segments (``spot/spot_traces_segments.csv.gz`` with
  ``spot/spot_traces_metadata.csv``): absolute time = the trace's start date at 00:00 UTC
  (the files carry only a date: an assumption) + the segment's offset. Each segment is one
  change-log row (capacity = value: instances available/held at that tick); a NaN row at the
  end of the trace makes the time after it unknown. `availability` traces also give offers.
  Traces with no start date (SpotHedge) or no recognisable instance type are skipped.
- Bamboo instance counts (``spot/spot_instance_count_traces_bamboo_parcae*.csv*``): zone and
  start time from the trace name (taken as UTC); number of running spot instances = capacity.
  Traces without a zone (one Bamboo p2 trace, Parcae) are skipped.
- SkyNomad GCP H100 (``spot/skynomad_gcp_h100_availability_13zones_2025-10.csv.gz``):
  capacity = available (0/1) per zone for ``a3-highgpu-8g``, plus its per-zone a3-highgpu-8g
  list prices for the window (zone-level rows that end with NaN after the window, where the
  region-level GCP history takes over again).
- SkyNomad AWS V100 spot prices (``spot/skynomad_aws_v100_spot_price_per_tick_9zones_...``):
  p3.2xlarge spot price per zone on the Can't Be Late 2023-02-15 ticks (195 s), written only
  when it changes, NaN after the last tick.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from orchestrator import catalog
from orchestrator.signals.importers._common import (
    CANDIDATE_COLUMNS,
    Part,
    changes_only,
    read_csv,
    source_entry,
    table,
    to_number,
    to_text,
    to_utc,
)

SEGMENTS: Final = Path("spot/spot_traces_segments.csv.gz")
SEGMENTS_META: Final = Path("spot/spot_traces_metadata.csv")
COUNTS: Final = Path("spot/spot_instance_count_traces_bamboo_parcae.csv.gz")
COUNTS_META: Final = Path("spot/spot_instance_count_traces_bamboo_parcae_metadata.csv")
SKYNOMAD_GCP: Final = Path("spot/skynomad_gcp_h100_availability_13zones_2025-10.csv.gz")
SKYNOMAD_AWS: Final = Path("spot/skynomad_aws_v100_spot_price_per_tick_9zones_2023-02.csv.gz")

# The Can't Be Late 2023-02-15 availability traces: start date at 00:00 UTC, 195 s ticks.
CBL_2023_START: Final = pd.Timestamp("2023-02-15T00:00:00Z")
CBL_2023_TICK_S: Final = 195
SKYNOMAD_GCP_INSTANCE: Final = "a3-highgpu-8g"
SKYNOMAD_AWS_INSTANCE: Final = "p3.2xlarge"

_SPOT_KEYS: Final = ["cloud", "zone", "instance_type"]
_PRICE_KEYS: Final = ["cloud", "region", "zone", "instance_type", "market"]
# An instance type at the start of a label: "p2.xlarge(K80x1; ...)" -> "p2.xlarge".
_INSTANCE_RE: Final = r"^([a-z][a-z0-9]*[.-][a-z0-9.-]*[a-z0-9])(?:\(|\s|$)"
_CBL_LICENSE: Final = (
    "no LICENSE file (skypilot-org/spot-traces asks for a citation of "
    "Can't Be Late, NSDI'24; MaoZiming/spothedge_ae has none)"
)


def _regions(cloud: str, zones: pd.Series) -> pd.Series:
    """The region of each zone (looked up once per distinct zone)."""
    return zones.map({z: catalog.region_of_zone(cloud, z) for z in zones.unique()})


def _spot_rows(
    time: pd.Series,
    cloud: pd.Series | str,
    zone: pd.Series | str,
    instance_type: pd.Series | str,
    capacity: pd.Series | float,
) -> pd.DataFrame:
    return table(
        "spot", time=time, cloud=cloud, zone=zone, instance_type=instance_type, capacity=capacity
    )


def _finish_spot(rows: pd.DataFrame) -> pd.DataFrame:
    """Sort a spot change log, keep the last row of a key at one time (an end row of one trace
    loses to a start row of the next), drop repeats."""
    rows = rows.sort_values([*_SPOT_KEYS, "time"], kind="stable")
    rows = rows.drop_duplicates([*_SPOT_KEYS, "time"], keep="last")
    return changes_only(rows, _SPOT_KEYS, "capacity").reset_index(drop=True)


def _drop_overlaps(meta: pd.DataFrame, part: Part, what: str) -> pd.DataFrame:
    """Keep, per (cloud, zone, instance_type), traces that do not overlap an earlier one:
    interleaved change logs of one key would be meaningless."""
    meta = meta.sort_values([*_SPOT_KEYS, "start"], kind="stable")
    keep = np.ones(len(meta), dtype=bool)
    last_end: dict[tuple[str, str, str], pd.Timestamp] = {}
    for i, (key, start, end, tid) in enumerate(
        zip(
            meta[_SPOT_KEYS].itertuples(index=False, name=None),
            meta["start"],
            meta["end"],
            meta["trace_id"],
            strict=True,
        )
    ):
        prev = last_end.get(key)
        if prev is not None and start < prev:
            keep[i] = False
            part.notes.append(f"{what}: trace {tid} overlaps an earlier trace of {key}; skipped.")
            continue
        last_end[key] = end
    return meta[keep]


def import_spot_segments(data_dir: Path) -> Part:
    seg_path, meta_path = data_dir / SEGMENTS, data_dir / SEGMENTS_META
    raw_meta = read_csv(
        meta_path,
        [
            "trace_id",
            "trace_kind",
            "cloud",
            "region",
            "zone",
            "instance_label",
            "instance_type",
            "target_nodes",
            "start_date_mmddyyyy",
        ],
    )
    raw_seg = read_csv(seg_path, ["trace_id", "start_offset_s", "end_offset_s", "value"])
    part = Part(name="spot_traces")
    meta = pd.DataFrame(
        {
            "trace_id": to_text(meta_path, raw_meta, "trace_id"),
            "kind": raw_meta["trace_kind"].fillna("").astype("str"),
            "cloud": to_text(meta_path, raw_meta, "cloud").str.lower(),
            "region": raw_meta["region"].fillna("").astype("str"),
            "zone": raw_meta["zone"].fillna("").astype("str"),
            "label": raw_meta["instance_label"].fillna("").astype("str"),
            "instance_type": raw_meta["instance_type"]
            .fillna("")
            .astype("str")
            .str.extract(_INSTANCE_RE, expand=False),
            "start": pd.to_datetime(
                raw_meta["start_date_mmddyyyy"], format="%m-%d-%Y", utc=True, errors="coerce"
            ),
        }
    )
    seg = pd.DataFrame(
        {
            "trace_id": to_text(seg_path, raw_seg, "trace_id"),
            "start_s": to_number(seg_path, raw_seg, "start_offset_s", allow_missing=False),
            "end_s": to_number(seg_path, raw_seg, "end_offset_s", allow_missing=False),
            "value": to_number(seg_path, raw_seg, "value", allow_missing=False),
        }
    )
    unknown_ids = sorted(set(seg["trace_id"]) - set(meta["trace_id"]))
    if unknown_ids:
        part.notes.append(
            f"{SEGMENTS}: {len(unknown_ids)} trace ids without metadata skipped "
            f"(first: {unknown_ids[0]})."
        )
    no_start = meta[meta["start"].isna()]
    if len(no_start):
        part.notes.append(
            f"{SEGMENTS_META}: {len(no_start)} traces have no start date and cannot be placed in "
            f"time; skipped: {', '.join(no_start['trace_id'])} (SpotHedge GCP1: A100 spot; the "
            "machine type is uncertain too, a2-highgpu-8g by file name, a2-ultragpu-4g by README)."
        )
    unnamed = meta[meta["start"].notna() & (meta["instance_type"].isna() | (meta["zone"] == ""))]
    if len(unnamed):
        part.notes.append(
            f"{SEGMENTS_META}: {len(unnamed)} traces name no zone or instance "
            f"type; skipped: {', '.join(unnamed['trace_id'])}."
        )
    meta = meta[meta["start"].notna() & meta["instance_type"].notna() & (meta["zone"] != "")]
    ends = seg.groupby("trace_id")["end_s"].max()
    meta = meta[meta["trace_id"].isin(ends.index)].copy()
    meta["end"] = meta["start"] + pd.to_timedelta(
        ends.reindex(meta["trace_id"]).to_numpy(), unit="s"
    )
    meta = _drop_overlaps(meta, part, str(SEGMENTS))

    rows = seg.merge(meta[["trace_id", "cloud", "zone", "instance_type", "start"]], on="trace_id")
    time = rows["start"] + pd.to_timedelta(rows["start_s"], unit="s")
    part.spot = _finish_spot(
        pd.concat(
            [
                _spot_rows(time, rows["cloud"], rows["zone"], rows["instance_type"], rows["value"]),
                _spot_rows(meta["end"], meta["cloud"], meta["zone"], meta["instance_type"], np.nan),
            ],
            ignore_index=True,
        )
    )

    avail = meta[meta["kind"] == "availability"]
    label = avail["label"].str.extract(r"^([A-Za-z0-9-]+)_(\d+)$")
    part.offers = pd.DataFrame(
        {
            "cloud": avail["cloud"],
            "region": avail["region"],
            "zone": avail["zone"],
            "instance_type": avail["instance_type"],
            "gpu_name": label[0].fillna(""),
            "gpu_count_hint": pd.to_numeric(label[1]),
        }
    )[list(CANDIDATE_COLUMNS)].drop_duplicates(["cloud", "zone", "instance_type"])
    n_pre = int((meta["kind"] != "availability").sum())
    part.notes.append(
        "Spot traces (Can't Be Late): absolute time = start date at 00:00 UTC + offset (the "
        "files carry only the date); capacity = the trace value (1-node: 1 = spot available, "
        "0 = not; multi-node: nodes obtained out of the target, a lower bound on capacity); NaN "
        f"after each trace's end. {n_pre} preemption traces are included as capacity (1 = the "
        "instance is held, 0 = preempted) but give no offers; only availability traces do."
    )
    part.sources.append(
        source_entry(
            "spot_traces_segments",
            data_dir,
            seg_path,
            _CBL_LICENSE,
            rows=len(raw_seg),
            origin="skypilot-org/spot-traces @221da1a; MaoZiming/spothedge_ae @df02263",
        )
    )
    part.sources.append(
        source_entry(
            "spot_traces_metadata",
            data_dir,
            meta_path,
            _CBL_LICENSE,
            rows=len(raw_meta),
            origin="skypilot-org/spot-traces @221da1a; MaoZiming/spothedge_ae @df02263",
        )
    )
    return part


_BAMBOO_ZONE: Final = r"-((?:us|eu|ap|sa|ca|me|af)-[a-z]+-\d[a-z])-"
_BAMBOO_SPAN: Final = (
    r"(\d{4}-\d{2}-\d{2})-(\d{2}):?(\d{2})-to-(\d{4}-\d{2}-\d{2})-"
    r"(\d{2}):?(\d{2})"
)


def import_instance_counts(data_dir: Path) -> Part:
    path, meta_path = data_dir / COUNTS, data_dir / COUNTS_META
    raw_meta = read_csv(meta_path, ["trace_id", "cloud", "instance_type"])
    raw = read_csv(path, ["trace_id", "t_offset_s", "n_running_instances"])
    part = Part(name="spot_instance_counts")
    meta = pd.DataFrame(
        {
            "trace_id": to_text(meta_path, raw_meta, "trace_id"),
            "cloud": to_text(meta_path, raw_meta, "cloud").str.lower(),
            "instance_type": to_text(meta_path, raw_meta, "instance_type"),
        }
    )
    meta["zone"] = meta["trace_id"].str.extract(_BAMBOO_ZONE, expand=False)
    span = meta["trace_id"].str.extract(_BAMBOO_SPAN)
    meta["start"] = pd.to_datetime(
        span[0] + "T" + span[1] + ":" + span[2] + "Z",
        format="%Y-%m-%dT%H:%MZ",
        utc=True,
        errors="coerce",
    )
    meta["name_end"] = pd.to_datetime(
        span[3] + "T" + span[4] + ":" + span[5] + "Z",
        format="%Y-%m-%dT%H:%MZ",
        utc=True,
        errors="coerce",
    )
    skipped = meta[meta["zone"].isna() | meta["start"].isna()]
    if len(skipped):
        part.notes.append(
            f"{COUNTS}: {len(skipped)} traces name no zone or start time and are skipped: "
            f"{', '.join(skipped['trace_id'])} (Parcae's region is not stated)."
        )
    meta = meta.drop(index=skipped.index)
    data = pd.DataFrame(
        {
            "trace_id": to_text(path, raw, "trace_id"),
            "offset_s": to_number(path, raw, "t_offset_s", allow_missing=False),
            "count": to_number(path, raw, "n_running_instances", allow_missing=False),
        }
    )
    last = data.groupby("trace_id")["offset_s"].max()
    meta = meta[meta["trace_id"].isin(last.index)].copy()
    data_end = meta["start"] + pd.to_timedelta(last.reindex(meta["trace_id"]).to_numpy(), unit="s")
    meta["end"] = data_end.where(data_end > meta["name_end"], meta["name_end"])
    meta = _drop_overlaps(meta, part, str(COUNTS))
    rows = data.merge(meta[["trace_id", "cloud", "zone", "instance_type", "start"]], on="trace_id")
    time = rows["start"] + pd.to_timedelta(rows["offset_s"], unit="s")
    part.spot = _finish_spot(
        pd.concat(
            [
                _spot_rows(time, rows["cloud"], rows["zone"], rows["instance_type"], rows["count"]),
                _spot_rows(meta["end"], meta["cloud"], meta["zone"], meta["instance_type"], np.nan),
            ],
            ignore_index=True,
        )
    )
    part.notes.append(
        "Bamboo spot instance counts: zone and start time from the trace name, taken as UTC "
        "(the repository does not say); capacity = running spot instances of the authors' "
        "cluster (a lower bound on what was obtainable); at repeated timestamps the last count "
        "wins; NaN after max(name end, last event). No offers are derived from them."
    )
    part.sources.append(
        source_entry(
            "spot_instance_count_traces_bamboo_parcae",
            data_dir,
            path,
            "MIT (uclasystem/bamboo; JF-D/Parcae, inherited from DeepSpeed)",
            rows=len(raw),
            origin="uclasystem/bamboo @8080929; JF-D/Parcae @efedee7",
        )
    )
    part.sources.append(
        source_entry(
            "spot_instance_count_traces_bamboo_parcae_metadata",
            data_dir,
            meta_path,
            "MIT (uclasystem/bamboo; JF-D/Parcae, inherited from DeepSpeed)",
            rows=len(raw_meta),
            origin="uclasystem/bamboo @8080929; JF-D/Parcae @efedee7",
        )
    )
    return part


def import_skynomad_gcp(data_dir: Path) -> Part:
    path = data_dir / SKYNOMAD_GCP
    raw = read_csv(
        path, ["zone", "time_utc", "available", "spot_usd_per_hour", "ondemand_usd_per_hour"]
    )
    part = Part(name="skynomad_gcp_h100")
    frame = pd.DataFrame(
        {
            "zone": to_text(path, raw, "zone"),
            "time": to_utc(path, raw, "time_utc"),
            "available": to_number(path, raw, "available", allow_missing=False),
            "spot": to_number(path, raw, "spot_usd_per_hour"),
            "on_demand": to_number(path, raw, "ondemand_usd_per_hour"),
        }
    ).sort_values(["zone", "time"], kind="stable")
    frame["region"] = _regions("gcp", frame["zone"])
    step = frame.groupby("zone")["time"].diff().dropna()
    tick = step.median() if len(step) else pd.Timedelta(600, unit="s")
    ends = frame.groupby(["zone", "region"], as_index=False)["time"].max()
    ends["time"] = ends["time"] + tick
    inst = SKYNOMAD_GCP_INSTANCE
    part.spot = _finish_spot(
        pd.concat(
            [
                _spot_rows(frame["time"], "gcp", frame["zone"], inst, frame["available"]),
                _spot_rows(ends["time"], "gcp", ends["zone"], inst, np.nan),
            ],
            ignore_index=True,
        )
    )
    prices = pd.concat(
        [
            table(
                "prices",
                time=frame["time"],
                cloud="gcp",
                region=frame["region"],
                zone=frame["zone"],
                instance_type=inst,
                market=market,
                usd_per_hour=frame[col],
            )
            for market, col in (("spot", "spot"), ("on_demand", "on_demand"))
        ]
        + [
            table(
                "prices",
                time=ends["time"],
                cloud="gcp",
                region=ends["region"],
                zone=ends["zone"],
                instance_type=inst,
                market=market,
                usd_per_hour=np.nan,
            )
            for market in ("spot", "on_demand")
        ],
        ignore_index=True,
    ).sort_values([*_PRICE_KEYS, "time"], kind="stable")
    part.prices = changes_only(prices, _PRICE_KEYS, "usd_per_hour").reset_index(drop=True)
    zones = ends[["zone", "region"]]
    part.offers = pd.DataFrame(
        {
            "cloud": "gcp",
            "region": zones["region"],
            "zone": zones["zone"],
            "instance_type": inst,
            "gpu_name": "H100",
            "gpu_count_hint": 8.0,
        }
    )[list(CANDIDATE_COLUMNS)]
    part.notes.append(
        f"SkyNomad GCP H100: capacity = available (1 = at least one of 16 a3-highgpu-1g probes "
        f"launched) recorded for {inst}, whose list prices the artifact attaches; its per-zone "
        "prices (constant, different from the region-level history) override the history "
        "during the window and end with NaN after it. A 60-tick probe gap on 2025-10-08/09 was "
        "filled by the authors as unavailable."
    )
    part.sources.append(
        source_entry(
            "skynomad_gcp_h100_availability",
            data_dir,
            path,
            "Apache-2.0",
            rows=len(raw),
            origin="andylizf/skynomad-artifact @62b9aaa",
        )
    )
    return part


def import_skynomad_aws_prices(data_dir: Path) -> Part:
    path = data_dir / SKYNOMAD_AWS
    raw = read_csv(path, ["zone", "tick", "spot_usd_per_hour"])
    part = Part(name="skynomad_aws_v100_spot_prices")
    frame = pd.DataFrame(
        {
            "zone": to_text(path, raw, "zone"),
            "tick": to_number(path, raw, "tick", allow_missing=False),
            "price": to_number(path, raw, "spot_usd_per_hour"),
        }
    ).sort_values(["zone", "tick"], kind="stable")
    frame["time"] = CBL_2023_START + pd.to_timedelta(frame["tick"] * CBL_2023_TICK_S, unit="s")
    frame["region"] = _regions("aws", frame["zone"])
    ends = frame.groupby(["zone", "region"], as_index=False)["tick"].max()
    ends["time"] = CBL_2023_START + pd.to_timedelta((ends["tick"] + 1) * CBL_2023_TICK_S, unit="s")
    prices = pd.concat(
        [
            table(
                "prices",
                time=frame["time"],
                cloud="aws",
                region=frame["region"],
                zone=frame["zone"],
                instance_type=SKYNOMAD_AWS_INSTANCE,
                market="spot",
                usd_per_hour=frame["price"],
            ),
            table(
                "prices",
                time=ends["time"],
                cloud="aws",
                region=ends["region"],
                zone=ends["zone"],
                instance_type=SKYNOMAD_AWS_INSTANCE,
                market="spot",
                usd_per_hour=np.nan,
            ),
        ],
        ignore_index=True,
    ).sort_values([*_PRICE_KEYS, "time"], kind="stable")
    part.prices = changes_only(prices, _PRICE_KEYS, "usd_per_hour").reset_index(drop=True)
    part.notes.append(
        "SkyNomad AWS V100: p3.2xlarge spot price per zone name on the Can't Be Late 2023-02-15 "
        f"ticks ({CBL_2023_START.isoformat()} + tick x {CBL_2023_TICK_S} s), written when it "
        "changes, NaN after the last tick. On-demand for these zones comes from the AWS "
        "snapshot's region-level rows (3.06 USD/h for p3.2xlarge in us-east-1, as the artifact)."
    )
    part.sources.append(
        source_entry(
            "skynomad_aws_v100_spot_price_per_tick",
            data_dir,
            path,
            "Apache-2.0",
            rows=len(raw),
            origin="andylizf/skynomad-artifact @62b9aaa (public AWS spot price archive)",
        )
    )
    return part
