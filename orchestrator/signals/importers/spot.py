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
    Loaded,
    Part,
    SourceFile,
    changes_only,
    importer,
    price_log,
    table,
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
# An instance type at the start of a label: "p2.xlarge(K80x1; ...)" -> "p2.xlarge".
_INSTANCE_RE: Final = r"^([a-z][a-z0-9]*[.-][a-z0-9.-]*[a-z0-9])(?:\(|\s|$)"
_CBL_LICENSE: Final = (
    "no LICENSE file (skypilot-org/spot-traces asks for a citation of "
    "Can't Be Late, NSDI'24; MaoZiming/spothedge_ae has none)"
)
_CBL_ORIGIN: Final = "skypilot-org/spot-traces @221da1a; MaoZiming/spothedge_ae @df02263"
_BAMBOO_LICENSE: Final = "MIT (uclasystem/bamboo; JF-D/Parcae, inherited from DeepSpeed)"
_BAMBOO_ORIGIN: Final = "uclasystem/bamboo @8080929; JF-D/Parcae @efedee7"
_SEGMENTS: Final = SourceFile(
    SEGMENTS,
    "spot_traces_segments",
    _CBL_LICENSE,
    _CBL_ORIGIN,
    ("trace_id", "start_offset_s", "end_offset_s", "value"),
)
_SEGMENTS_META: Final = SourceFile(
    SEGMENTS_META,
    "spot_traces_metadata",
    _CBL_LICENSE,
    _CBL_ORIGIN,
    (
        "trace_id",
        "trace_kind",
        "cloud",
        "region",
        "zone",
        "instance_label",
        "instance_type",
        "target_nodes",
        "start_date_mmddyyyy",
    ),
)
_COUNTS: Final = SourceFile(
    COUNTS,
    "spot_instance_count_traces_bamboo_parcae",
    _BAMBOO_LICENSE,
    _BAMBOO_ORIGIN,
    ("trace_id", "t_offset_s", "n_running_instances"),
)
_COUNTS_META: Final = SourceFile(
    COUNTS_META,
    "spot_instance_count_traces_bamboo_parcae_metadata",
    _BAMBOO_LICENSE,
    _BAMBOO_ORIGIN,
    ("trace_id", "cloud", "instance_type"),
)
_SKYNOMAD_GCP: Final = SourceFile(
    SKYNOMAD_GCP,
    "skynomad_gcp_h100_availability",
    "Apache-2.0",
    "andylizf/skynomad-artifact @62b9aaa",
    ("zone", "time_utc", "available", "spot_usd_per_hour", "ondemand_usd_per_hour"),
)
_SKYNOMAD_AWS: Final = SourceFile(
    SKYNOMAD_AWS,
    "skynomad_aws_v100_spot_price_per_tick",
    "Apache-2.0",
    "andylizf/skynomad-artifact @62b9aaa (public AWS spot price archive)",
    ("zone", "tick", "spot_usd_per_hour"),
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


def _traced_spot(data: pd.DataFrame, meta: pd.DataFrame, offset: str, value: str) -> pd.DataFrame:
    """The spot change log of traces: each `data` row at its trace's start + `offset`
    seconds with capacity `value`, and a NaN row at each trace's end (`meta`)."""
    rows = data.merge(meta[["trace_id", "cloud", "zone", "instance_type", "start"]], on="trace_id")
    time = rows["start"] + pd.to_timedelta(rows[offset], unit="s")
    return _finish_spot(
        pd.concat(
            [
                _spot_rows(time, rows["cloud"], rows["zone"], rows["instance_type"], rows[value]),
                _spot_rows(meta["end"], meta["cloud"], meta["zone"], meta["instance_type"], np.nan),
            ],
            ignore_index=True,
        )
    )


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


def _segment_meta(part: Part, m: Loaded, seg: pd.DataFrame) -> pd.DataFrame:
    """The traces that can be placed (a start date, a zone, an instance type, segments),
    with their end; notes say which were skipped and why."""
    meta = pd.DataFrame(
        {
            "trace_id": m.text("trace_id"),
            "kind": m.optional_text("trace_kind"),
            "cloud": m.text("cloud").str.lower(),
            "region": m.optional_text("region"),
            "zone": m.optional_text("zone"),
            "label": m.optional_text("instance_label"),
            "instance_type": m.optional_text("instance_type").str.extract(
                _INSTANCE_RE, expand=False
            ),
            "start": pd.to_datetime(
                m.raw["start_date_mmddyyyy"], format="%m-%d-%Y", utc=True, errors="coerce"
            ),
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
    return _drop_overlaps(meta, part, str(SEGMENTS))


@importer("spot_traces", _SEGMENTS, _SEGMENTS_META)
def import_spot_segments(part: Part, data_dir: Path, s: Loaded, m: Loaded) -> None:
    seg = pd.DataFrame(
        {
            "trace_id": s.text("trace_id"),
            "start_s": s.number("start_offset_s", allow_missing=False),
            "end_s": s.number("end_offset_s", allow_missing=False),
            "value": s.number("value", allow_missing=False),
        }
    )
    meta = _segment_meta(part, m, seg)
    part.spot = _traced_spot(seg, meta, "start_s", "value")

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


_BAMBOO_ZONE: Final = r"-((?:us|eu|ap|sa|ca|me|af)-[a-z]+-\d[a-z])-"
_BAMBOO_SPAN: Final = (
    r"(\d{4}-\d{2}-\d{2})-(\d{2}):?(\d{2})-to-(\d{4}-\d{2}-\d{2})-"
    r"(\d{2}):?(\d{2})"
)


def _span_time(span: pd.DataFrame, first: int) -> pd.Series:
    """The UTC time of groups `first` (date), `first + 1` (hour), `first + 2` (minute)."""
    return pd.to_datetime(
        span[first] + "T" + span[first + 1] + ":" + span[first + 2] + "Z",
        format="%Y-%m-%dT%H:%MZ",
        utc=True,
        errors="coerce",
    )


@importer("spot_instance_counts", _COUNTS, _COUNTS_META)
def import_instance_counts(part: Part, data_dir: Path, c: Loaded, m: Loaded) -> None:
    meta = pd.DataFrame(
        {
            "trace_id": m.text("trace_id"),
            "cloud": m.text("cloud").str.lower(),
            "instance_type": m.text("instance_type"),
        }
    )
    meta["zone"] = meta["trace_id"].str.extract(_BAMBOO_ZONE, expand=False)
    span = meta["trace_id"].str.extract(_BAMBOO_SPAN)
    meta["start"] = _span_time(span, 0)
    meta["name_end"] = _span_time(span, 3)
    skipped = meta[meta["zone"].isna() | meta["start"].isna()]
    if len(skipped):
        part.notes.append(
            f"{COUNTS}: {len(skipped)} traces name no zone or start time and are skipped: "
            f"{', '.join(skipped['trace_id'])} (Parcae's region is not stated)."
        )
    meta = meta.drop(index=skipped.index)
    data = pd.DataFrame(
        {
            "trace_id": c.text("trace_id"),
            "offset_s": c.number("t_offset_s", allow_missing=False),
            "count": c.number("n_running_instances", allow_missing=False),
        }
    )
    last = data.groupby("trace_id")["offset_s"].max()
    meta = meta[meta["trace_id"].isin(last.index)].copy()
    data_end = meta["start"] + pd.to_timedelta(last.reindex(meta["trace_id"]).to_numpy(), unit="s")
    meta["end"] = data_end.where(data_end > meta["name_end"], meta["name_end"])
    meta = _drop_overlaps(meta, part, str(COUNTS))
    part.spot = _traced_spot(data, meta, "offset_s", "count")
    part.notes.append(
        "Bamboo spot instance counts: zone and start time from the trace name, taken as UTC "
        "(the repository does not say); capacity = running spot instances of the authors' "
        "cluster (a lower bound on what was obtainable); at repeated timestamps the last count "
        "wins; NaN after max(name end, last event). No offers are derived from them."
    )


def _zone_prices(
    time: pd.Series,
    cloud: str,
    where: pd.DataFrame | pd.Series,  # with region and zone columns
    instance_type: str,
    market: str,
    usd_per_hour: pd.Series | float,
) -> pd.DataFrame:
    """Prices rows of one instance type and market in the zones (and regions) of `where`."""
    return table(
        "prices",
        time=time,
        cloud=cloud,
        region=where["region"],
        zone=where["zone"],
        instance_type=instance_type,
        market=market,
        usd_per_hour=usd_per_hour,
    )


@importer("skynomad_gcp_h100", _SKYNOMAD_GCP)
def import_skynomad_gcp(part: Part, data_dir: Path, f: Loaded) -> None:
    frame = pd.DataFrame(
        {
            "zone": f.text("zone"),
            "time": f.utc("time_utc"),
            "available": f.number("available", allow_missing=False),
            "spot": f.number("spot_usd_per_hour"),
            "on_demand": f.number("ondemand_usd_per_hour"),
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
    markets = ("spot", "on_demand")
    part.prices = price_log(
        [_zone_prices(frame["time"], "gcp", frame, inst, m, frame[m]) for m in markets]
        + [_zone_prices(ends["time"], "gcp", ends, inst, m, np.nan) for m in markets]
    )
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


@importer("skynomad_aws_v100_spot_prices", _SKYNOMAD_AWS)
def import_skynomad_aws_prices(part: Part, data_dir: Path, f: Loaded) -> None:
    frame = pd.DataFrame(
        {
            "zone": f.text("zone"),
            "tick": f.number("tick", allow_missing=False),
            "price": f.number("spot_usd_per_hour"),
        }
    ).sort_values(["zone", "tick"], kind="stable")
    frame["time"] = CBL_2023_START + pd.to_timedelta(frame["tick"] * CBL_2023_TICK_S, unit="s")
    frame["region"] = _regions("aws", frame["zone"])
    ends = frame.groupby(["zone", "region"], as_index=False)["tick"].max()
    ends["time"] = CBL_2023_START + pd.to_timedelta((ends["tick"] + 1) * CBL_2023_TICK_S, unit="s")
    inst = SKYNOMAD_AWS_INSTANCE
    part.prices = price_log(
        [
            _zone_prices(frame["time"], "aws", frame, inst, "spot", frame["price"]),
            _zone_prices(ends["time"], "aws", ends, inst, "spot", np.nan),
        ]
    )
    part.notes.append(
        "SkyNomad AWS V100: p3.2xlarge spot price per zone name on the Can't Be Late 2023-02-15 "
        f"ticks ({CBL_2023_START.isoformat()} + tick x {CBL_2023_TICK_S} s), written when it "
        "changes, NaN after the last tick. On-demand for these zones comes from the AWS "
        "snapshot's region-level rows (3.06 USD/h for p3.2xlarge in us-east-1, as the artifact)."
    )
