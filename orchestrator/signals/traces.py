"""The trace directory: one format for recorded, imported and generated signal history.

A trace directory holds five files (see docs/traces.md for the full contract):

- ``manifest.json``: format name and version, time span, sources, per-metric max age.
- ``offers.parquet``: what can be bought: cloud, region, zone, instance_type, gpu_type,
  gpu_count, grid_zone (one row per instance type per zone; both markets implied).
- ``prices.parquet``: a change log of prices: time, cloud, region, zone ('' = every zone of
  the region), instance_type, market ('spot' | 'on_demand'), usd_per_hour. A row holds until
  the next row of the same key (as-of join). NaN on a region row means "not sold from then
  on"; NaN on a zone row means "no zone-specific price": the region's price applies.
- ``spot.parquet``: a change log of spot capacity: time, cloud, zone, instance_type
  ('' = every GPU instance type in the zone), capacity (instances obtainable: 0 = none,
  NaN = unknown, a gap). A row holds until the next row of the same key.
- ``grid.parquet``: samples per grid zone in long form: time, grid_zone, metric, value,
  source. A sample holds until the next one of the same (grid_zone, metric), for at most
  the metric's max age (manifest ``max_age_s``), then the value is unknown.

Times are tz-aware UTC. Reading validates every column and names the file, column and row
of the first problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from orchestrator.errors import InputError

FORMAT: Final = "heliotrope-trace"
VERSION: Final = 1

GRID_METRICS: Final = (
    "carbon_avg_g_per_kwh",  # location-based (average) intensity, direct or life-cycle
    "carbon_marginal_g_per_kwh",  # marginal operating emissions rate
    "carbon_avg_yearly_g_per_kwh",  # yearly average, fallback where no hourly series exists
    "curtailment_mw",  # renewable generation curtailed in the zone
    "power_price_usd_per_mwh",  # wholesale price; negative prices kept (a curtailment proxy)
)

DEFAULT_MAX_AGE_S: Final[Mapping[str, float]] = {
    "carbon_avg_g_per_kwh": 2 * 3600.0,
    "carbon_marginal_g_per_kwh": 2 * 3600.0,
    "carbon_avg_yearly_g_per_kwh": 366 * 86400.0,
    "curtailment_mw": 2 * 3600.0,
    "power_price_usd_per_mwh": 2 * 3600.0,
}

# column -> kind: "str", "int", "float", "time"
COLUMNS: Final[Mapping[str, Mapping[str, str]]] = {
    "offers": {
        "cloud": "str",
        "region": "str",
        "zone": "str",
        "instance_type": "str",
        "gpu_type": "str",
        "gpu_count": "int",
        "grid_zone": "str",
    },
    "prices": {
        "time": "time",
        "cloud": "str",
        "region": "str",
        "zone": "str",
        "instance_type": "str",
        "market": "str",
        "usd_per_hour": "float",
    },
    "spot": {
        "time": "time",
        "cloud": "str",
        "zone": "str",
        "instance_type": "str",
        "capacity": "float",
    },
    "grid": {
        "time": "time",
        "grid_zone": "str",
        "metric": "str",
        "value": "float",
        "source": "str",
    },
}
MARKETS: Final = ("spot", "on_demand")


@dataclass(frozen=True)
class Trace:
    """A trace in memory. Frames follow `COLUMNS`; `manifest` is the parsed manifest.json."""

    offers: pd.DataFrame
    prices: pd.DataFrame
    spot: pd.DataFrame
    grid: pd.DataFrame
    manifest: Mapping[str, Any] = field(default_factory=dict)

    def max_age_s(self, metric: str) -> float:
        ages = self.manifest.get("max_age_s", {})
        return float(ages.get(metric, DEFAULT_MAX_AGE_S.get(metric, 2 * 3600.0)))


def empty_frame(table: str) -> pd.DataFrame:
    """An empty frame with the table's columns and dtypes."""
    return _coerce(pd.DataFrame({c: [] for c in COLUMNS[table]}), table, "<memory>")


def make_manifest(
    *,
    generator: str,
    sources: list[Mapping[str, Any]] | None = None,
    notes: list[str] | None = None,
    max_age_s: Mapping[str, float] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "generator": generator,
        "sources": list(sources or []),
        "notes": list(notes or []),
        "max_age_s": {**DEFAULT_MAX_AGE_S, **(max_age_s or {})},
        **extra,
    }


def write_trace(trace: Trace, out: Path) -> Path:
    """Write `trace` to directory `out` (created). Frames are validated first, so a bad
    trace writes nothing. The manifest is written last: a directory without one is
    incomplete."""
    frames = {name: _coerce(getattr(trace, name), name, f"<{name}>") for name in COLUMNS}
    for name, frame in frames.items():
        _check_values(frame, name, f"<{name}>")
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in frames.items():
        sort_cols = ["time"] if "time" in frame.columns else list(frame.columns[:4])
        ordered = frame.sort_values(sort_cols, kind="stable").reset_index(drop=True)
        ordered.to_parquet(out / f"{name}.parquet", index=False)
    manifest = dict(trace.manifest) or make_manifest(generator="unknown")
    times = [f["time"] for f in (frames["prices"], frames["spot"], frames["grid"]) if len(f)]
    if times:
        manifest.setdefault("start", min(t.min() for t in times).isoformat())
        manifest.setdefault("end", max(t.max() for t in times).isoformat())
    tmp = out / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    tmp.replace(out / "manifest.json")
    return out


def read_trace(path: Path) -> Trace:
    """Read and validate a trace directory. Raises `InputError` naming the file, the column
    or row, what was expected and how to fix it."""
    if not path.is_dir():
        raise InputError(
            str(path),
            "",
            "a trace directory",
            got="no such directory",
            fix="run `heliotrope traces generate --out DIR` or `heliotrope traces import`",
        )
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise InputError(
            str(manifest_path),
            "",
            "a manifest.json (written last, so its absence means an incomplete trace)",
            got="missing",
            fix="re-create the trace directory",
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(
            str(manifest_path), f"line {exc.lineno}", "valid JSON", got=exc.msg
        ) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(
            str(manifest_path),
            "format",
            f"{FORMAT!r}",
            got=repr(manifest.get("format") if isinstance(manifest, dict) else manifest),
        )
    if manifest.get("version") != VERSION:
        raise InputError(
            str(manifest_path),
            "version",
            f"{VERSION}",
            got=manifest.get("version"),
            fix="re-create the trace with this version of heliotrope",
        )
    frames: dict[str, pd.DataFrame] = {}
    for name in COLUMNS:
        file = path / f"{name}.parquet"
        if not file.is_file():
            raise InputError(
                str(file),
                "",
                f"the {name} table",
                got="missing",
                fix="re-create the trace directory",
            )
        frame = _coerce(_read_parquet(file), name, str(file))
        _check_values(frame, name, str(file))
        frames[name] = frame
    return Trace(manifest=manifest, **frames)


def _read_parquet(file: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(file)
    except Exception as exc:  # pyarrow raises many types for a damaged file
        raise InputError(str(file), "", "a readable Parquet file", got=type(exc).__name__) from exc


def _coerce(frame: pd.DataFrame, table: str, where: str) -> pd.DataFrame:
    return _coerce_columns(frame, COLUMNS[table], where)


def _coerce_columns(frame: pd.DataFrame, spec: Mapping[str, str], where: str) -> pd.DataFrame:
    """The columns of `spec` (name -> time, str, int or float) of `frame`, converted; a
    missing column or a value of the wrong kind raises naming the column."""
    missing = [c for c in spec if c not in frame.columns]
    if missing:
        raise InputError(
            where,
            f"column {missing[0]!r}",
            f"columns {list(spec)}",
            got=list(frame.columns),
            fix=f"add the {missing[0]!r} column",
        )
    out: dict[str, Any] = {}
    for col, kind in spec.items():
        series = frame[col]
        try:
            if kind == "time":
                out[col] = pd.to_datetime(series, utc=True)
            elif kind == "str":
                out[col] = series.fillna("").astype(str)
            elif kind == "int":
                out[col] = pd.to_numeric(series).astype(np.int64)
            else:
                out[col] = pd.to_numeric(series).astype(np.float64)
        except (ValueError, TypeError) as exc:
            raise InputError(
                where, f"column {col!r}", f"{kind} values", got=str(exc)[:120]
            ) from exc
    return pd.DataFrame(out, index=frame.index).reset_index(drop=True)


def _first_bad_row(mask: pd.Series) -> int:
    return int(np.flatnonzero(mask.to_numpy())[0])


# A trace time before this is a unit mistake (epoch seconds read as nanoseconds land in
# January 1970), not history: the earliest public GPU price or grid data is far later.
EARLIEST: Final = pd.Timestamp("2000-01-01", tz="UTC")
# Key columns of a series per table: one value per key and time.
_SERIES_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "prices": ("cloud", "region", "zone", "instance_type", "market"),
    "spot": ("cloud", "zone", "instance_type"),
    "grid": ("grid_zone", "metric", "source"),
}
_VALUE: Final[Mapping[str, str]] = {"prices": "usd_per_hour", "spot": "capacity", "grid": "value"}
# No GPU machine costs 100,000 USD an hour; no grid metric reaches 10 million (MW, g/kWh or
# USD/MWh): larger values are unit mistakes that overflow sums and plots downstream.
_CEILING: Final[Mapping[str, float]] = {"prices": 1e5, "grid": 1e7}


def _check_values(frame: pd.DataFrame, table: str, where: str) -> None:
    """Refuse what a trace table cannot hold: empty or pre-2000 times, infinite or
    astronomical values, two values of one series at one time, and each table's own rules."""
    _check_times(frame, where)
    _check_series(frame, table, where)
    rules = _TABLE_RULES.get(table)
    if rules is not None:
        rules(frame, where)


def _check_times(frame: pd.DataFrame, where: str) -> None:
    if "time" in frame.columns and frame["time"].isna().any():
        row = _first_bad_row(frame["time"].isna())
        raise InputError(where, f"row {row}, column 'time'", "a UTC timestamp", got="empty")
    if "time" in frame.columns and len(frame) and (frame["time"] < EARLIEST).any():
        row = _first_bad_row(frame["time"] < EARLIEST)
        raise InputError(
            where,
            f"row {row}, column 'time'",
            "a time after 2000-01-01",
            got=str(frame["time"].iloc[row]),
            fix="epoch seconds were probably read as nanoseconds: write times "
            "as timestamps (or epoch nanoseconds)",
        )


def _check_series(frame: pd.DataFrame, table: str, where: str) -> None:
    value = _VALUE.get(table)
    if value is None or not len(frame):
        return
    values = frame[value].to_numpy(dtype=np.float64)
    infinite = np.isinf(values) & ~((table == "spot") & (values > 0))  # inf: no limit
    if infinite.any():
        row = int(np.flatnonzero(infinite)[0])
        raise InputError(
            where,
            f"row {row}, column {value!r}",
            "a finite number (NaN for unknown)",
            got=float(values[row]),
        )
    ceiling = _CEILING.get(table)
    with np.errstate(invalid="ignore"):
        huge = np.isfinite(values) & (np.abs(values) > ceiling) if ceiling else None
    if huge is not None and huge.any():
        row = int(np.flatnonzero(huge)[0])
        raise InputError(
            where,
            f"row {row}, column {value!r}",
            f"a value of at most {ceiling:g} in size (a unit mistake?)",
            got=float(values[row]),
        )
    keys = [*_SERIES_KEYS[table], "time"]
    same = frame.duplicated(keys, keep=False)
    if same.any():
        clash = frame[same].groupby(keys, sort=False)[value].nunique(dropna=False) > 1
        if clash.any():
            key = clash[clash].index[0]
            raise InputError(
                where,
                "rows "
                + ", ".join(
                    map(
                        str,
                        frame.index[(frame[keys].apply(tuple, axis=1) == key).to_numpy()][:3],
                    )
                ),
                "one value per series and time",
                got=f"{key}: conflicting values",
                fix="drop the duplicate rows or fix their values",
            )


def _refuse(
    bad: pd.Series,
    frame: pd.DataFrame,
    col: str,
    where: str,
    expected: str,
    show: Callable[[Any], object] = repr,
) -> None:
    """Raise naming the first row where `bad` holds, its column `col` and its value."""
    if bad.any():
        row = _first_bad_row(bad)
        raise InputError(
            where, f"row {row}, column {col!r}", expected, got=show(frame[col].iloc[row])
        )


def _check_offers(frame: pd.DataFrame, where: str) -> None:
    _refuse(frame["gpu_count"] < 1, frame, "gpu_count", where, "at least 1", int)
    dup = frame.duplicated(["cloud", "zone", "instance_type"])
    if dup.any():
        row = _first_bad_row(dup)
        raise InputError(
            where,
            f"row {row}",
            "one row per (cloud, zone, instance_type)",
            got="a duplicate",
            fix="drop the repeated row",
        )


def _check_prices(frame: pd.DataFrame, where: str) -> None:
    _refuse(~frame["market"].isin(MARKETS), frame, "market", where, f"one of {MARKETS}")
    neg = frame["usd_per_hour"] < 0
    _refuse(neg, frame, "usd_per_hour", where, "a price >= 0 or NaN", float)


def _check_spot(frame: pd.DataFrame, where: str) -> None:
    _refuse(frame["capacity"] < 0, frame, "capacity", where, "a count >= 0 or NaN", float)


def _check_grid(frame: pd.DataFrame, where: str) -> None:
    bad = ~frame["metric"].isin(GRID_METRICS)
    _refuse(bad, frame, "metric", where, f"one of {GRID_METRICS}")
    carbon = frame["metric"].str.startswith("carbon") & (frame["value"] < 0)
    _refuse(carbon, frame, "value", where, "a carbon intensity >= 0", float)


_TABLE_RULES: Final[Mapping[str, Callable[[pd.DataFrame, str], None]]] = {
    "offers": _check_offers,
    "prices": _check_prices,
    "spot": _check_spot,
    "grid": _check_grid,
}


# -- side tables: published forecasts and spot risk signals ------------------------------
#
# Optional files next to the five tables (a trace without them reads as before; `Trace`
# does not hold them). They keep what the recorder saw that the change-log tables cannot:
#
# - ``forecasts.parquet``: forecasts the sources publish (Electricity Maps, WattTime, UK
#   ESO), one row per issue and target hour: issued_at (when Heliotrope read it, so a
#   replay at time t may use only rows with issued_at <= t: no peeking), time (the start of
#   the hour or interval forecast), grid_zone, metric (one of `GRID_METRICS`), value,
#   source (``electricitymaps``, ``watttime``, ``uk-carbon``).
# - ``spot_signals.parquet``: a change log of AWS spot risk signals per instance type:
#   time, cloud, region, zone ('' = the region), instance_type, metric, value, source.
#   Metrics (`SPOT_METRICS`): ``interruption_pct_max`` (Spot Advisor: the upper bound of the
#   band of monthly interruption frequency as the JSON gives it, %: 5, 11, 16, 22, or
#   100 for ">20%"),
#   ``savings_pct`` (Spot Advisor: saving over on-demand, %), ``placement_score`` (EC2
#   GetSpotPlacementScores, 1..10, per zone). A row holds until the next row of the same
#   key; NaN = unknown (the recorder writes one at a sample's valid_until).

SPOT_METRICS: Final = ("interruption_pct_max", "savings_pct", "placement_score")
SIDE_TABLES: Final[Mapping[str, Mapping[str, str]]] = {
    "forecasts": {
        "issued_at": "time",
        "time": "time",
        "grid_zone": "str",
        "metric": "str",
        "value": "float",
        "source": "str",
    },
    "spot_signals": {
        "time": "time",
        "cloud": "str",
        "region": "str",
        "zone": "str",
        "instance_type": "str",
        "metric": "str",
        "value": "float",
        "source": "str",
    },
}
_SIDE_METRICS: Final[Mapping[str, tuple[str, ...]]] = {
    "forecasts": GRID_METRICS,
    "spot_signals": SPOT_METRICS,
}


def empty_side_table(name: str) -> pd.DataFrame:
    return _coerce_side(pd.DataFrame({c: [] for c in SIDE_TABLES[name]}), name, "<memory>")


def _coerce_side(frame: pd.DataFrame, name: str, where: str) -> pd.DataFrame:
    spec = SIDE_TABLES[name]
    result = _coerce_columns(frame, spec, where)
    for col, kind in spec.items():
        if kind == "time" and result[col].isna().any():
            row = _first_bad_row(result[col].isna())
            raise InputError(where, f"row {row}, column {col!r}", "a UTC timestamp", got="empty")
    bad = ~result["metric"].isin(_SIDE_METRICS[name])
    if bad.any():
        row = _first_bad_row(bad)
        raise InputError(
            where,
            f"row {row}, column 'metric'",
            f"one of {_SIDE_METRICS[name]}",
            got=repr(result["metric"].iloc[row]),
        )
    return result


def write_side_table(frame: pd.DataFrame, name: str, out: Path) -> Path | None:
    """Write side table `name` into trace directory `out` (validated first); an empty frame
    removes the file. Returns the path written, or None."""
    checked = _coerce_side(frame, name, f"<{name}>")
    path = out / f"{name}.parquet"
    if checked.empty:
        path.unlink(missing_ok=True)
        return None
    out.mkdir(parents=True, exist_ok=True)
    order = [c for c in ("issued_at", "time") if c in checked.columns]
    tmp = out / f"{name}.parquet.tmp"
    checked.sort_values(order, kind="stable").reset_index(drop=True).to_parquet(tmp, index=False)
    tmp.replace(path)
    return path


def read_side_table(path: Path, name: str) -> pd.DataFrame:
    """Side table `name` of the trace directory `path` (empty when the trace has none)."""
    file = path / f"{name}.parquet"
    if not file.is_file():
        return empty_side_table(name)
    return _coerce_side(_read_parquet(file), name, str(file))


def forecasts_as_of(forecasts: pd.DataFrame, at: Any) -> pd.DataFrame:
    """What was known at `at` of the published forecasts: rows issued at or before `at`,
    of each (source, grid_zone, metric, time) the latest issue. Nothing issued later is
    visible (a replay may not peek)."""
    when = pd.Timestamp(at)
    when = when.tz_localize("UTC") if when.tzinfo is None else when.tz_convert("UTC")
    seen = forecasts[forecasts["issued_at"] <= when]
    latest = seen.sort_values("issued_at", kind="stable").drop_duplicates(
        ["source", "grid_zone", "metric", "time"], keep="last"
    )
    return latest.sort_values(["source", "grid_zone", "metric", "time"], kind="stable").reset_index(
        drop=True
    )
