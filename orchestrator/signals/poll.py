"""Poll live signal sources into a trace directory and/or the state store.

    report = poll(["uk-carbon", "electricitymaps"], Path("traces/live"), now=clock.now())

Each source reads its window around `now` (`SignalSource.poll_window`) for the keys it
covers among `regions` (default: every AWS and GCP region of the catalog). One failing
source (or key) never stops the others: the report says per source what was read, what
failed and why (without credentials). New samples are appended to the state store
(duplicates skipped) and to the trace directory's samples log (``samples.parquet``), from
which its prices, spot and grid tables and its offers are rebuilt (`record`); rows the
directory had from elsewhere (an import, a generated scenario) are kept.

`freshness` answers "how old is what we know": per source and key the newest sample, when
it was observed, until when it is valid and whether it is stale now. `download` backfills
history for the sources that have history endpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pandas as pd

from orchestrator import catalog
from orchestrator.errors import HeliotropeError, InputError, UnknownNameError
from orchestrator.model import SignalKind
from orchestrator.signals.importers.offers import build_offers
from orchestrator.signals.sources.base import (
    FORECAST_SUFFIX,
    FRAME_COLUMNS,
    FixedClock,
    SignalSource,
    SourceContext,
    concat_frames,
    empty_frame,
    utc,
)
from orchestrator.signals.sources.carbon import ElectricityMaps, UkCarbon, WattTime
from orchestrator.signals.sources.clouds import (
    AwsOnDemand,
    AwsPlacementScore,
    AwsSpotAdvisor,
    AwsSpotPrice,
    GcpBilling,
)
from orchestrator.signals.sources.http import REDACTOR, HttpClient
from orchestrator.signals.sources.isos import PRICE_SOURCES, CaisoCurtailment
from orchestrator.signals.sources.power import Eia930, Entsoe, EntsoeGeneration
from orchestrator.signals.sources.tracemap import samples_to_rows
from orchestrator.signals.traces import (
    COLUMNS,
    SIDE_TABLES,
    Trace,
    make_manifest,
    read_trace,
    write_side_table,
    write_trace,
)
from orchestrator.signals.traces import empty_frame as empty_table

if TYPE_CHECKING:
    from orchestrator.state import StateStore

logger = logging.getLogger(__name__)

# The registry: one line per source class (its module says everything else about it:
# name, kind, history, terms, window).
_SOURCE_CLASSES: Final[tuple[Any, ...]] = (
    AwsSpotPrice,
    AwsPlacementScore,
    AwsSpotAdvisor,
    AwsOnDemand,
    GcpBilling,
    ElectricityMaps,
    WattTime,
    UkCarbon,
    CaisoCurtailment,
    Entsoe,
    EntsoeGeneration,
    Eia930,
    *PRICE_SOURCES.values(),  # caiso-prices, ercot-prices, ... (gridstatus)
)
_CLASSES: Final[Mapping[str, Any]] = {cls.name: cls for cls in _SOURCE_CLASSES}
if len(_CLASSES) != len(_SOURCE_CLASSES):  # a name taken twice: one source would vanish
    raise RuntimeError(
        f"two signal sources share a name: {sorted(c.name for c in _SOURCE_CLASSES)}"
    )
SOURCE_NAMES: tuple[str, ...] = tuple(_CLASSES)
# Where two sources sample one grid series at one time, the earlier wins in a trace.
GRID_PRIORITY: Final = (
    "electricitymaps",
    "uk-carbon",
    "eia930",
    "entsoe-generation",
    "watttime",
    "entsoe-prices",
    "caiso-curtailment",
    *PRICE_SOURCES,
)
SAMPLES_FILE: Final = "samples.parquet"
POLL_DEADLINE_S: Final = 120.0
GENERATOR: Final = "signals-poll"
STATUS_WINDOW: Final = timedelta(days=30)

# The data's licence or terms of use per source, for the trace manifest.
TERMS: Final[Mapping[str, str]] = {name: cls.terms for name, cls in _CLASSES.items()}
RECORDER_NOTE: Final = (
    "signals poll: prices, spot and grid rows of live sources are rebuilt from samples.parquet "
    "(the recorder's log of every sample, with observed_at and valid_until); a NaN row at a "
    "sample's valid_until marks it unknown from then (see docs/signals.md)."
)


def make_source(name: str, ctx: SourceContext) -> SignalSource:
    cls = _CLASSES.get(name)
    if cls is None:
        raise UnknownNameError("signal source", name, list(SOURCE_NAMES))
    source: SignalSource = cls(ctx)
    return source


def _polled_clouds() -> list[tuple[str, tuple[str, ...]]]:
    """(cloud, its catalog regions) of each registered cloud with signal sources."""
    from providers import registry

    return [(s.name, s.regions()) for s in registry.specs() if s.signal_sources]


def default_regions() -> list[tuple[str, str]]:
    """Every catalog region of every cloud the registry polls signals for."""
    return [(c, r) for c, regions in _polled_clouds() for r in regions]


def parse_regions(values: Sequence[str]) -> list[tuple[str, str]]:
    """``aws:us-east-1`` -> ("aws", "us-east-1"); the cloud and region must be known."""
    out = []
    for value in values:
        cloud, sep, region = value.partition(":")
        if not sep or cloud not in catalog.CLOUDS or region not in catalog.regions(cloud):
            raise InputError(
                "",
                "--region",
                "CLOUD:REGION with a catalog region (e.g. aws:us-east-1, gcp:europe-west4)",
                got=repr(value),
            )
        out.append((cloud, region))
    return out


# -- reports ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceResult:
    """What one source did in one poll. `status`: ok | partial (some keys failed) | failed |
    skipped (no key of the requested regions is covered)."""

    name: str
    status: str
    rows: int = 0
    keys: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    newest: datetime | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped")


@dataclass(frozen=True)
class PollReport:
    now: datetime
    out: Path | None
    results: tuple[SourceResult, ...]
    samples: pd.DataFrame = field(default_factory=empty_frame, repr=False)
    store_error: str | None = None

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and self.store_error is None

    def result(self, name: str) -> SourceResult:
        return next(r for r in self.results if r.name == name)

    def table(self) -> list[dict[str, Any]]:
        return [
            {
                "source": r.name,
                "status": r.status,
                "rows": r.rows,
                "keys": len(r.keys),
                "newest": r.newest.isoformat() if r.newest else "",
                "seconds": round(r.duration_s, 2),
                "error": "; ".join(r.errors)[:300],
            }
            for r in self.results
        ]


@dataclass(frozen=True, slots=True)
class FreshnessRow:
    source: str
    key: str
    region: str  # regions fed by a grid zone (catalog), or the region of a price/spot key
    kind: str
    unit: str
    last_time: datetime
    observed_at: datetime
    valid_until: datetime | None
    stale: bool
    age_s: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "key": self.key,
            "region": self.region,
            "unit": self.unit,
            "last_time": self.last_time.isoformat(),
            "observed_at": self.observed_at.isoformat(),
            "valid_until": self.valid_until.isoformat() if self.valid_until else "",
            "stale": self.stale,
            "age_min": round(self.age_s / 60.0, 1),
        }


# -- polling ------------------------------------------------------------------------------


def _context(
    now: datetime,
    http: HttpClient | None,
    credentials: Mapping[str, str] | None,
    base_urls: Mapping[str, str] | None,
    options: Mapping[str, Any] | None,
    env: Mapping[str, str] | None,
    sleep: Callable[[float], None] | None,
) -> SourceContext:
    wait = sleep or time.sleep
    return SourceContext(
        http=http or HttpClient(sleep=wait),
        clock=FixedClock(now),
        credentials=dict(credentials or {}),
        base_urls=dict(base_urls or {}),
        env=env,
        options=dict(options or {}),
        sleep=wait,
    )


def _message(exc: BaseException) -> str:
    text = str(exc) if isinstance(exc, HeliotropeError) else type(exc).__name__
    return REDACTOR(text)


def _read_one(
    source: SignalSource, keys: Sequence[str], start: datetime, end: datetime
) -> tuple[pd.DataFrame, SourceResult]:
    t0 = time.monotonic()
    try:
        frame, errors = source.read_partial(keys, start, end)
    except HeliotropeError as exc:
        logger.warning("%s: failed: %s", source.name, _message(exc))
        return empty_frame(), SourceResult(
            source.name,
            "failed",
            keys=tuple(keys),
            errors=(_message(exc),),
            duration_s=time.monotonic() - t0,
        )
    except Exception as exc:  # a bug in one source must not stop the others
        logger.error("%s: unexpected %s", source.name, type(exc).__name__)
        return empty_frame(), SourceResult(
            source.name,
            "failed",
            keys=tuple(keys),
            errors=(f"unexpected {type(exc).__name__}",),
            duration_s=time.monotonic() - t0,
        )
    messages = tuple(f"{k}: {_message(e)}" if k != "*" else _message(e) for k, e in errors.items())
    for m in messages:
        logger.warning("%s: %s", source.name, m)
    if not errors:
        status = "ok"
    elif len(frame) and len(errors) < max(1, len(keys)):
        status = "partial"
    else:
        status = "failed"
    newest = None
    real = frame[frame["time"] <= frame["observed_at"]] if len(frame) else frame
    if len(real):
        newest = pd.Timestamp(real["time"].max()).to_pydatetime()
    return frame, SourceResult(
        source.name,
        status,
        rows=len(frame),
        keys=tuple(keys),
        errors=messages,
        newest=newest,
        duration_s=time.monotonic() - t0,
    )


def poll(
    sources: Sequence[str],
    out: Path | None,
    *,
    now: datetime,
    store: StateStore | None = None,
    http: HttpClient | None = None,
    regions: Sequence[tuple[str, str]] | None = None,
    credentials: Mapping[str, str] | None = None,
    base_urls: Mapping[str, str] | None = None,
    options: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    sleep: Callable[[float], None] | None = None,
    window: tuple[datetime, datetime] | None = None,
    deadline_s: float | None = POLL_DEADLINE_S,
    monotonic: Callable[[], float] = time.monotonic,
) -> PollReport:
    """Read every source in `sources` (default: all) at `now` and record what was read.

    `credentials` maps environment-variable names to values (e.g. from Airflow
    connections); `base_urls` maps source names to base URLs (tests, mirrors); `window`
    replaces each source's own poll window (as `download` does). Sources not started within
    `deadline_s` of the poll's start (each retries its own failures) are reported failed,
    not polled: one poll never runs on without end against servers answering 500."""
    names = list(sources) or list(SOURCE_NAMES)
    for name in names:
        if name not in _CLASSES:
            raise UnknownNameError("signal source", name, list(SOURCE_NAMES))
    now = utc(now)
    ctx = _context(now, http, credentials, base_urls, options, env, sleep)
    wanted = list(regions) if regions else default_regions()
    frames: list[pd.DataFrame] = []
    results: list[SourceResult] = []
    started = monotonic()
    for name in names:
        if deadline_s is not None and monotonic() - started > deadline_s:
            results.append(
                SourceResult(
                    name,
                    "failed",
                    errors=(f"not polled: the poll ran past its {deadline_s:g} s deadline",),
                )
            )
            continue
        try:
            source = make_source(name, ctx)
        except HeliotropeError as exc:
            results.append(SourceResult(name, "failed", errors=(_message(exc),)))
            continue
        keys = source.default_keys(wanted)
        if not keys:
            results.append(
                SourceResult(
                    name, "skipped", errors=("no key of the requested regions is covered",)
                )
            )
            continue
        start, end = window if window else source.poll_window(now)
        frame, result = _read_one(source, keys, start, end)
        frames.append(frame)
        results.append(result)
        logger.info("%s: %s, %d rows for %d keys", name, result.status, result.rows, len(keys))
    samples = concat_frames(frames)
    store_error = None
    if store is not None and len(samples):
        try:
            store.append_samples(samples)
        except HeliotropeError as exc:
            store_error = _message(exc)
            logger.error("state store: %s", store_error)
    if out is not None and len(samples):  # nothing read: the directory is left as it was
        record(out, samples, now=now, sources=[r.name for r in results if r.rows])
    return PollReport(
        now=now, out=out, results=tuple(results), samples=samples, store_error=store_error
    )


def download(
    source: str,
    start: datetime,
    end: datetime,
    out: Path,
    **kwargs: Any,
) -> PollReport:
    """Backfill [start, end) of one source with a history endpoint into `out`."""
    cls = _CLASSES.get(source)
    if cls is None:
        raise UnknownNameError("signal source", source, list(SOURCE_NAMES))
    if not cls.history:
        have = [n for n, c in _CLASSES.items() if c.history]
        raise InputError(
            "", "--source", "a source with a history endpoint: " + ", ".join(have), got=repr(source)
        )
    start, end = utc(start), utc(end)
    if end <= start:
        raise InputError("", "--end", "a time after --start", got=f"{start} .. {end}")
    now = utc(kwargs.pop("now", None) or datetime.now(tz=start.tzinfo))
    return poll([source], out, now=max(now, end), window=(start, end), **kwargs)


# -- the trace directory ------------------------------------------------------------------


def read_samples(out: Path) -> pd.DataFrame:
    path = out / SAMPLES_FILE
    if not path.is_file():
        return empty_frame()
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises many types for a damaged file
        raise InputError(str(path), "", "a readable Parquet file", got=type(exc).__name__) from exc
    missing = [c for c in FRAME_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(
            str(path), "columns", ", ".join(FRAME_COLUMNS), got=f"missing {', '.join(missing)}"
        )
    for col in ("time", "observed_at", "valid_until"):
        frame[col] = pd.to_datetime(frame[col], utc=True).dt.as_unit("ns")
    return frame[list(FRAME_COLUMNS)]


def _merge_samples(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    both = concat_frames([old, new])
    ident = ["kind", "key", "time", "source", "observed_at", "unit"]
    return (
        both.drop_duplicates(ident, keep="last")
        .sort_values(["time", "key", "unit", "observed_at"], kind="stable")
        .reset_index(drop=True)
    )


def _minus(frame: pd.DataFrame, remove: pd.DataFrame) -> pd.DataFrame:
    """Rows of `frame` not in `remove` (all columns compared; NaN equals NaN)."""
    if frame.empty or remove.empty:
        return frame
    cols = list(frame.columns)
    marked = frame.merge(remove[cols].drop_duplicates(), on=cols, how="left", indicator=True)
    return frame[(marked["_merge"] == "left_only").to_numpy()].reset_index(drop=True)


def _tables(samples: pd.DataFrame, notes: list[str]) -> dict[str, pd.DataFrame]:
    rows = samples_to_rows(samples, GRID_PRIORITY)
    offers = build_offers(rows.candidates, notes) if len(rows.candidates) else empty_table("offers")
    return {
        "offers": offers,
        "prices": rows.prices,
        "spot": rows.spot,
        "grid": rows.grid,
        "forecasts": rows.forecasts,
        "spot_signals": rows.spot_signals,
    }  # side tables


def record(out: Path, new: pd.DataFrame, *, now: datetime, sources: Sequence[str] = ()) -> Trace:
    """Append `new` samples to the trace directory `out` (created when missing) and
    rebuild its tables. Rows the directory holds that did not come from its samples log
    are kept as they are."""
    out = Path(out)
    base: Trace | None = None
    if (out / "manifest.json").is_file():
        base = read_trace(out)
    old = read_samples(out)
    samples = _merge_samples(old, new)
    notes: list[str] = []
    fresh = _tables(samples, notes)
    if base is not None:
        previous = _tables(old, [])
        kept = {name: _minus(getattr(base, name), previous[name]) for name in COLUMNS}
    else:
        kept = {name: empty_table(name) for name in COLUMNS}
    merged: dict[str, pd.DataFrame] = {}
    for name in COLUMNS:
        parts = [f for f in (kept[name], fresh[name]) if len(f)]
        frame = pd.concat(parts, ignore_index=True) if parts else empty_table(name)
        if name == "offers":
            frame = frame.drop_duplicates(["cloud", "zone", "instance_type"], keep="first")
        else:
            frame = frame.drop_duplicates(keep="first")
        merged[name] = frame.reset_index(drop=True)
    manifest = dict(base.manifest) if base is not None else make_manifest(generator=GENERATOR)
    listed = {str(s.get("name")) for s in manifest.get("sources", []) if isinstance(s, dict)}
    manifest["sources"] = list(manifest.get("sources", [])) + [
        {"name": n, "origin": "live API (heliotrope signals)", "license": TERMS.get(n, "")}
        for n in sources
        if n not in listed
    ]
    manifest_notes = list(manifest.get("notes", []))
    for note in [RECORDER_NOTE, *notes]:
        if note not in manifest_notes and not note.startswith("Offers: "):
            manifest_notes.append(note)
    manifest["notes"] = manifest_notes
    times = [f["time"] for f in (merged["prices"], merged["spot"], merged["grid"]) if len(f)]
    if times:
        manifest["start"] = min(pd.Timestamp(t.min()) for t in times).isoformat()
        manifest["end"] = max(pd.Timestamp(t.max()) for t in times).isoformat()
    manifest["recorded"] = {"last_poll": utc(now).isoformat(), "samples": len(samples)}
    trace = Trace(manifest=manifest, **merged)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (SAMPLES_FILE + ".tmp")
    samples.to_parquet(tmp, index=False)
    tmp.replace(out / SAMPLES_FILE)
    write_trace(trace, out)
    for name in SIDE_TABLES:  # forecasts, spot_signals: rebuilt from the samples log alone
        write_side_table(fresh[name], name, out)
    return trace


# -- freshness ----------------------------------------------------------------------------


def _store_samples(store: StateStore, now: datetime) -> pd.DataFrame:
    from orchestrator.state import samples_to_frame

    lo = (now - STATUS_WINDOW).timestamp()
    hi = (now + timedelta(days=3)).timestamp()
    got = [s for kind in SignalKind for s in store.samples(kind, None, lo, hi)]
    return samples_to_frame(got) if got else empty_frame()


def _regions_of(key: str) -> str:
    parts = key.split("/")
    if len(parts) in (4, 5):
        return f"{parts[0]}:{parts[1]}"
    fed = [
        f"{c}:{r}"
        for c, regions in _polled_clouds()
        for r in regions
        if catalog.grid_zone(c, r) == key
    ]
    return ", ".join(fed[:4]) + (f" +{len(fed) - 4}" if len(fed) > 4 else "")


def freshness(out: Path | None, store: StateStore | None, *, now: datetime) -> list[FreshnessRow]:
    """Per (source, key, unit): the newest sample, when it was observed, until when it is
    valid, and whether it is stale at `now` (past its valid_until, or no valid_until)."""
    now = utc(now)
    frames = []
    if out is not None:
        frames.append(read_samples(Path(out)))
    if store is not None:
        frames.append(_store_samples(store, now))
    samples = concat_frames(frames)
    if samples.empty:
        return []
    forecast = samples["source"].astype(str).str.endswith(FORECAST_SUFFIX)
    s = samples[~forecast & (samples["time"] <= samples["observed_at"])]  # observations only
    rows: list[FreshnessRow] = []
    for (source, key, unit), g in s.groupby(["source", "key", "unit"], sort=True):
        last = g.sort_values("time", kind="stable").iloc[-1]
        observed = pd.Timestamp(g["observed_at"].max()).to_pydatetime()
        vu_max = g["valid_until"].max()
        valid_until = None if pd.isna(vu_max) else pd.Timestamp(vu_max).to_pydatetime()
        rows.append(
            FreshnessRow(
                source=str(source),
                key=str(key),
                region=_regions_of(str(key)),
                kind=str(last["kind"]),
                unit=str(unit),
                last_time=pd.Timestamp(last["time"]).to_pydatetime(),
                observed_at=observed,
                valid_until=valid_until,
                stale=valid_until is None or valid_until <= now,
                age_s=(now - observed).total_seconds(),
            )
        )
    return rows


# -- documentation ------------------------------------------------------------------------


def zone_sources(zone: str) -> list[str]:
    """The grid sources that cover a grid zone."""
    ctx = SourceContext(env={})
    out = []
    for name in (
        "electricitymaps",
        "watttime",
        "uk-carbon",
        "eia930",
        "caiso-curtailment",
        "entsoe-prices",
        "entsoe-generation",
        *PRICE_SOURCES,
    ):
        source = _CLASSES[name](ctx)
        if source.covers(zone):
            out.append(name)
    return out


def region_zone_markdown() -> str:
    """The region -> grid-zone table of docs/signals.md, from `orchestrator.catalog`.

    Regenerate: ``python -c "from orchestrator.signals.poll import region_zone_markdown as m;
    print(m())"``."""
    from orchestrator.signals.sources.carbon import ZONE_TO_WATTTIME
    from orchestrator.signals.sources.power import ZONE_TO_EIC, balancing_area

    lines = [
        "| cloud | region | location | grid zone | WattTime region | ENTSO-E area | "
        "EIA BA | grid sources |",
        "|---|---|---|---|---|---|---|---|",
    ]
    from providers import registry

    for cloud in (s.name for s in registry.specs() if s.geography is not None):
        for region in catalog.regions(cloud):
            info = catalog.region_info(cloud, region)
            if info is None:
                continue
            zone = info.grid_zone or ""
            lines.append(
                f"| {cloud} | {region} | {info.location} | {zone or '(unknown)'} | "
                f"{ZONE_TO_WATTTIME.get(zone, '')} | {ZONE_TO_EIC.get(zone, '')} | "
                f"{balancing_area(zone) or ''} | {', '.join(zone_sources(zone)) if zone else ''} |"
            )
    return "\n".join(lines) + "\n"
