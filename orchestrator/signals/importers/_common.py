"""Shared pieces of the importers: the importer skeleton, strict CSV reading, change-log
helpers, the `Part` result.

Every importer reads one dataset of ``../shared/data`` and returns a `Part`: rows for the
four trace tables (offers as *candidates*, see `offers.py`), the manifest source entries and
notes. The skeleton is `importer`: a dataset's files are `SourceFile`s (path, columns, how
the manifest cites it); the decorated body gets a fresh `Part` and each file read
(`Loaded`), fills the tables and notes, and every file is cited after it. Reading is strict:
a missing required column or a value that does not parse raises `InputError` naming the
file, the column and (for values) the line.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from orchestrator.errors import InputError
from orchestrator.signals.traces import COLUMNS, empty_frame

# Columns of an offer candidate: the offers table minus what `offers.build_offers` derives,
# plus the dataset's own GPU description used when the catalog does not know the type.
CANDIDATE_COLUMNS: Final = (
    "cloud",
    "region",
    "zone",
    "instance_type",
    "gpu_name",
    "gpu_count_hint",
)
HOUR_NS: Final = 3600 * 10**9
# The key of a prices change log (`price_log`), time aside.
PRICE_KEYS: Final = ("cloud", "region", "zone", "instance_type", "market")


def empty_candidates() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series([], dtype="str") for c in CANDIDATE_COLUMNS})
    frame["gpu_count_hint"] = pd.Series([], dtype="float64")
    return frame


@dataclass
class Part:
    """What one importer produced. Frames follow `COLUMNS` (offers: `CANDIDATE_COLUMNS`)."""

    name: str
    offers: pd.DataFrame = field(default_factory=empty_candidates)
    prices: pd.DataFrame = field(default_factory=lambda: empty_frame("prices"))
    spot: pd.DataFrame = field(default_factory=lambda: empty_frame("spot"))
    grid: pd.DataFrame = field(default_factory=lambda: empty_frame("grid"))
    sources: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def cite(self, data_dir: Path, loaded: Loaded) -> None:
        """Add the manifest entry of a file read (its rows: the data rows of the file)."""
        f = loaded.file
        self.sources.append(
            source_entry(
                f.entry, data_dir, loaded.path, f.license, rows=len(loaded.raw), origin=f.origin
            )
        )


@dataclass(frozen=True, slots=True)
class SourceFile:
    """One file of the shared data directory: where it lies, the columns an importer reads
    (`optional` ones where present) and how the manifest cites it."""

    path: Path  # relative to the data directory
    entry: str  # the manifest source name
    license: str
    origin: str
    columns: tuple[str, ...]
    optional: tuple[str, ...] = ()

    def read(self, data_dir: Path) -> Loaded:
        path = data_dir / self.path
        return Loaded(self, path, read_csv(path, self.columns, self.optional))


@dataclass(frozen=True, slots=True)
class Loaded:
    """A `SourceFile` as read: its path and raw columns, with the strict converters."""

    file: SourceFile
    path: Path
    raw: pd.DataFrame

    def number(self, col: str, *, allow_missing: bool = True) -> pd.Series:
        return to_number(self.path, self.raw, col, allow_missing=allow_missing)

    def utc(self, col: str, fmt: str = "ISO8601") -> pd.Series:
        return to_utc(self.path, self.raw, col, fmt)

    def text(self, col: str) -> pd.Series:
        return to_text(self.path, self.raw, col)

    def optional_text(self, col: str) -> pd.Series:
        """Column `col` as strings, an empty field as ''."""
        return self.raw[col].fillna("").astype("str")


# The body of an importer: (the part to fill, the data directory, each file read).
Body = Callable[..., None]


class Importer:
    """One dataset's importer, ``importer(data_dir) -> Part``: reads `files` (all must be
    there; `import_shared_data` skips a dataset that lacks one), runs the body on a fresh
    `Part` named `name`, then cites each file in the manifest."""

    def __init__(self, name: str, files: Sequence[SourceFile], body: Body) -> None:
        self.name = name
        self.files = tuple(files)
        self.body = body
        functools.update_wrapper(self, body)

    def __call__(self, data_dir: Path) -> Part:
        part = Part(name=self.name)
        loaded = [f.read(data_dir) for f in self.files]
        self.body(part, data_dir, *loaded)
        for one in loaded:
            part.cite(data_dir, one)
        return part


def importer(name: str, *files: SourceFile) -> Callable[[Body], Importer]:
    """Decorator: the importer of dataset `name` from `files` (see `Importer`)."""

    def wrap(body: Body) -> Importer:
        return Importer(name, files, body)

    return wrap


def source_entry(
    name: str, data_dir: Path, path: Path, license_: str, *, rows: int, origin: str
) -> dict[str, Any]:
    """One manifest ``sources`` entry. `rows` counts the data rows read from the file."""
    try:
        rel = str(path.relative_to(data_dir))
    except ValueError:
        rel = str(path)
    return {"name": name, "path": rel, "license": license_, "rows": int(rows), "origin": origin}


def read_csv(path: Path, required: Sequence[str], optional: Sequence[str] = ()) -> pd.DataFrame:
    """Read the `required` (and present `optional`) columns of a CSV (gzip by extension).

    Strings stay strings: only an empty field is missing ("NA" is Namibia's zone id).
    """
    wanted = set(required) | set(optional)
    try:
        frame = pd.read_csv(
            path,
            usecols=lambda c: c in wanted,
            keep_default_na=False,
            na_values=[""],
            low_memory=False,
        )
    except FileNotFoundError as exc:
        raise InputError(str(path), "", "the dataset file", got="missing") from exc
    except pd.errors.EmptyDataError as exc:
        raise InputError(
            str(path), "", "a CSV file with a header row", got="an empty file"
        ) from exc
    except (
        pd.errors.ParserError,
        UnicodeDecodeError,
        EOFError,
        OSError,
        ValueError,
        zlib.error,
    ) as exc:
        raise InputError(
            str(path), "", "a readable CSV file", got=f"{type(exc).__name__}: {str(exc)[:120]}"
        ) from exc
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(
            str(path),
            f"column {missing[0]!r}",
            f"columns {list(required)}",
            got=f"columns {list(frame.columns)}",
            fix=f"restore the {missing[0]!r} column (see SOURCES.md)",
        )
    return frame


def _bad_value(path: Path, frame: pd.DataFrame, col: str, bad: pd.Series, expected: str) -> None:
    if bool(bad.any()):
        pos = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            str(path), f"line {pos + 2}, column {col!r}", expected, got=repr(frame[col].iloc[pos])
        )


def to_number(
    path: Path, frame: pd.DataFrame, col: str, *, allow_missing: bool = True
) -> pd.Series:
    """Column `col` as float64; raises on text that is not a number (and on empties unless
    `allow_missing`)."""
    raw = frame[col]
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        out = raw.astype("float64")
    else:
        out = pd.to_numeric(raw, errors="coerce").astype("float64")
        _bad_value(path, frame, col, out.isna() & raw.notna(), "a number")
    if not allow_missing:
        _bad_value(path, frame, col, out.isna(), "a number (not empty)")
    return out


def to_utc(path: Path, frame: pd.DataFrame, col: str, fmt: str = "ISO8601") -> pd.Series:
    """Column `col` parsed as UTC timestamps (naive text is taken as UTC)."""
    raw = frame[col]
    out = pd.to_datetime(raw, utc=True, format=fmt, errors="coerce")
    expected = "a timestamp" + ("" if fmt == "ISO8601" else f" {fmt}")
    _bad_value(path, frame, col, out.isna(), expected)
    return out


def to_text(path: Path, frame: pd.DataFrame, col: str) -> pd.Series:
    """Column `col` as non-empty strings."""
    raw = frame[col]
    _bad_value(path, frame, col, raw.isna(), "a non-empty value")
    return raw.astype("str")


def table(name: str, **cols: Any) -> pd.DataFrame:
    """A frame of trace table `name` from column arrays (scalars broadcast)."""
    frame = pd.DataFrame(cols)
    return frame[list(COLUMNS[name])]


def grid_values(
    time: pd.Series, grid_zone: pd.Series | str, metric: str, value: pd.Series, source: str
) -> tuple[pd.DataFrame, int]:
    """Grid rows of the samples that have a value, and how many had none (skipped)."""
    keep = value.notna().to_numpy()
    zone = grid_zone[keep] if isinstance(grid_zone, pd.Series) else grid_zone
    frame = table(
        "grid", time=time[keep], grid_zone=zone, metric=metric, value=value[keep], source=source
    )
    return frame.reset_index(drop=True), int((~keep).sum())


def changes_only(frame: pd.DataFrame, keys: Sequence[str], value: str) -> pd.DataFrame:
    """Keep the first row of each run of equal values per key (NaN equals NaN): a change log.

    `frame` must be sorted by time within each key.
    """
    if frame.empty:
        return frame
    first = ~frame.duplicated(list(keys), keep="first")
    prev = frame.groupby(list(keys), sort=False)[value].shift(1)
    cur = frame[value]
    same = ~first & ((prev == cur) | (prev.isna() & cur.isna()))
    return frame[~same]


def price_log(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Prices rows as a change log: concatenated, sorted by key and time, repeats dropped."""
    keys = list(PRICE_KEYS)
    rows = pd.concat(frames, ignore_index=True).sort_values([*keys, "time"], kind="stable")
    return changes_only(rows, keys, "usd_per_hour").reset_index(drop=True)


def drop_covered(
    lower: pd.DataFrame, higher: pd.DataFrame, within_ns: int = HOUR_NS
) -> pd.DataFrame:
    """Grid rows of `lower` for which `higher` has a sample of the same (grid_zone, metric)
    less than `within_ns` earlier (or at the same time): the higher-priority source
    covers that moment, so the lower one is dropped there."""
    if lower.empty or higher.empty:
        return lower
    left = lower.assign(_row=np.arange(len(lower))).sort_values("time", kind="stable")
    right = higher[["time", "grid_zone", "metric"]].assign(_t_high=higher["time"])
    right = right.sort_values("time", kind="stable")
    merged = pd.merge_asof(left, right, on="time", by=["grid_zone", "metric"], direction="backward")
    age = merged["time"] - merged["_t_high"]
    covered = (age.notna() & (age < pd.Timedelta(within_ns, unit="ns"))).to_numpy()
    keep_rows = np.sort(merged["_row"].to_numpy()[~covered])
    return lower.iloc[keep_rows]
