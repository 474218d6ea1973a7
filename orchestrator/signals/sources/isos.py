"""US ISO day-ahead prices and CAISO curtailment through gridstatus (the ``grid`` extra).

gridstatus reads each ISO's own publication (CAISO OASIS, NYISO's OASIS postings, MISO's
market reports, ERCOT's MIS, SPP's marketplace, PJM Data Miner, ISO-NE's web services) and
returns one frame shape for all of them (``Interval Start``, ``Interval End``,
``Location``, ``LMP``); this module reads that frame for one hub per ISO and keys it by the
Electricity Maps zone of the cloud regions in the ISO (`ISO_SPECS`).

- ``<iso>-prices`` (`IsoPrices`): the day-ahead hourly LMP at the ISO's hub, USD/MWh,
  negative prices kept (the curtailment proxy where no curtailment quantity is published),
  valid for exactly the priced hour. Tomorrow's prices are published values and are read.
- ``caiso-curtailment`` (`CaisoCurtailment`): CAISO's daily renewables report (the page
  CAISO publishes every morning for the day before, read by ``CAISO.get_curtailment``):
  wind and solar curtailment MWh per hour summed over types and reasons = average MW.
  No URL to configure.

Days are the ISO's local days (gridstatus' unit); a day the ISO has not published
(`NoDataFoundException`, or a 404) is a gap, not an error. Frames are validated like every answer:
a missing column, a time without a zone or an infinite price is a `MalformedResponse`; a
price or curtailment the ISO left empty is NaN (unknown). Faults are mapped by
`library.call` (401/403 -> `AuthFailed`, 429/5xx/timeouts -> retried, then
`SourceUnavailable`). gridstatus hides some statuses: CAISO OASIS answers a 429 or 5xx
with "no data" after its own retries, which is then a gap.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any, ClassVar, Final
from zoneinfo import ZoneInfo

import pandas as pd

from orchestrator.errors import InputError
from orchestrator.model import SignalKind
from orchestrator.signals.sources.base import KeyedSource, Obs, SourceContext, check_time
from orchestrator.signals.sources.errors import (
    MalformedResponse,
    RequestRejected,
    SourceUnavailable,
    short,
)
from orchestrator.signals.sources.http import REDACTOR
from orchestrator.signals.sources.library import ATTEMPTS, call, require

logger = logging.getLogger(__name__)

GRID_EXTRA: Final = "grid"
HOUR: Final = timedelta(hours=1)
CAISO_ZONE: Final = "US-CAL-CISO"
CURTAILMENT_LAG: Final = HOUR  # as the CAISO CSV source had: the hour + 1 h
MAX_DAYS: Final = 400  # one call per day: a window longer than this is refused


@dataclass(frozen=True, slots=True)
class IsoSpec:
    """One ISO: the gridstatus class, the Electricity Maps zone it is keyed by, the hub
    whose day-ahead LMP stands for the zone, its local time zone, and the environment
    variables gridstatus needs for it (none for most)."""

    iso: str
    zone: str
    location: str
    tz: str
    credentials: tuple[str, ...] = ()
    terms: str = ""
    location_column: str = "Location"  # PJM names hubs by pnode id ("Location Id")


ISO_SPECS: Final[Mapping[str, IsoSpec]] = {
    "caiso-prices": IsoSpec(
        "CAISO", "US-CAL-CISO", "TH_NP15_GEN-APND", "US/Pacific", terms="CAISO OASIS public data"
    ),
    "ercot-prices": IsoSpec(
        "Ercot", "US-TEX-ERCO", "HB_NORTH", "US/Central", terms="ERCOT public data (MIS)"
    ),
    "spp-prices": IsoSpec(
        "SPP", "US-CENT-SWPP", "SPPNORTH_HUB", "US/Central", terms="SPP public data (marketplace)"
    ),
    "miso-prices": IsoSpec(
        "MISO", "US-MIDW-MISO", "MINN.HUB", "EST", terms="MISO public market reports"
    ),
    "pjm-prices": IsoSpec(
        "PJM",
        "US-MIDA-PJM",
        "34964545",
        "US/Eastern",  # DOMINION HUB
        credentials=("PJM_API_KEY",),
        terms="PJM Data Miner terms (registered key)",
        location_column="Location Id",
    ),
    "nyiso-prices": IsoSpec(
        "NYISO", "US-NY-NYIS", "N.Y.C.", "US/Eastern", terms="NYISO public data"
    ),
    "isone-prices": IsoSpec(
        "ISONE",
        "US-NE-ISNE",
        ".H.INTERNAL_HUB",
        "US/Eastern",
        terms="ISO-NE public data (ISO Express)",
    ),
}
ZONE_TO_ISO: Final[Mapping[str, str]] = {s.zone: n for n, s in ISO_SPECS.items()}


def _no_data_type(source: str) -> type[BaseException]:
    gs = require(source, "gridstatus", GRID_EXTRA)
    cls: type[BaseException] = gs.NoDataFoundException
    return cls


def _local_days(start: datetime, end: datetime, tz: str, source: str) -> list[date]:
    zone = ZoneInfo(tz)
    first, last = start.astimezone(zone).date(), end.astimezone(zone).date()
    n = (last - first).days + 1
    if n > MAX_DAYS:
        raise InputError(
            source,
            "--start / --end",
            f"a window of at most {MAX_DAYS} days (one request per day)",
            got=f"{n} days",
            fix="download it in parts",
        )
    return [first + timedelta(days=i) for i in range(max(n, 0))]


def _times(frame: pd.DataFrame, col: str, source: str, what: str) -> pd.Series:
    series = frame[col]
    if not isinstance(series.dtype, pd.DatetimeTZDtype):
        raise MalformedResponse(
            source, f"{what}.{col}", f"expected times with a UTC offset, got {series.dtype}"
        )
    out: pd.Series = pd.Series(series.dt.tz_convert("UTC"), index=series.index)
    for t in (out.min(), out.max()):
        if pd.notna(t):
            try:
                check_time(pd.Timestamp(t).to_pydatetime())
            except ValueError:
                raise MalformedResponse(source, f"{what}.{col}", f"out of range: {t}") from None
    return out


def _need(frame: object, columns: tuple[str, ...], source: str, what: str) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise MalformedResponse(source, what, f"expected a table, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise MalformedResponse(
            source, f"{what}.columns", f"expected {list(columns)}, missing {missing}"
        )
    return frame


def lmp_obs(
    frame: object,
    location: str,
    zone: str,
    source: str,
    what: str = "lmp",
    price_col: str = "LMP",
    location_col: str = "Location",
) -> list[Obs]:
    """The hub's rows of a gridstatus LMP frame -> USD/MWh per interval start (UTC), valid
    until the interval's end. NaN (the ISO left the price out) stays NaN; an infinite or
    non-numeric price, a naive time or a repeated interval is malformed."""
    f = _need(frame, ("Interval Start", "Interval End", location_col, price_col), source, what)
    f = f[f[location_col].astype(str) == location]
    if f.empty:
        return []
    starts = _times(f, "Interval Start", source, what)
    ends = _times(f, "Interval End", source, what)
    values = pd.to_numeric(f[price_col], errors="coerce")
    bad = f[price_col].notna() & values.isna()
    if bad.any():
        raise MalformedResponse(
            source,
            f"{what}.{price_col}",
            f"expected a number, got {short(f[price_col][bad].iloc[0])}",
        )
    if (values.abs() == math.inf).any():
        raise MalformedResponse(source, f"{what}.{price_col}", "expected a finite price")
    if starts.duplicated().any():
        raise MalformedResponse(
            source,
            f"{what}.Interval Start",
            f"one row per hour at {location!r}, got a repeated interval",
        )
    if ((ends - starts) <= pd.Timedelta(0)).any():
        raise MalformedResponse(source, f"{what}.Interval End", "expected an end after the start")
    return [
        Obs(
            pd.Timestamp(s).to_pydatetime(),
            zone,
            float(v),
            "usd_per_mwh",
            pd.Timestamp(e).to_pydatetime(),
            source,
        )
        for s, e, v in zip(starts, ends, values, strict=True)
    ]


def curtailment_obs(
    frame: object, day: date, tz: str, source: str = "caiso-curtailment", zone: str = CAISO_ZONE
) -> list[Obs]:
    """``CAISO.get_curtailment`` for one report day -> curtailed MWh per hour (= average
    MW) summed over fuel, type and reason; an hour whose every cell is 'NA' is NaN. Rows of
    hours outside the report's own local day (gridstatus steps 24 UTC hours, so on the
    spring-forward day its last row is the next day's first hour) are left to that day."""
    f = _need(frame, ("Interval Start", "Interval End", "Curtailment MWH"), source, "curtailment")
    if f.empty:
        return []
    starts = _times(f, "Interval Start", source, "curtailment")
    local_day = starts.dt.tz_convert(ZoneInfo(tz)).dt.date
    mwh = pd.to_numeric(f["Curtailment MWH"], errors="coerce")
    if (f["Curtailment MWH"].notna() & mwh.isna()).any():
        raise MalformedResponse(source, "curtailment.Curtailment MWH", "expected numbers")
    if ((mwh < 0) | (mwh.abs() == math.inf)).any():
        raise MalformedResponse(
            source, "curtailment.Curtailment MWH", "expected a finite curtailment >= 0"
        )
    kept = pd.DataFrame({"time": starts, "mwh": mwh})[(local_day == day).to_numpy()]
    per_hour = kept.groupby("time", sort=True)["mwh"].sum(min_count=1)
    return [
        Obs(
            pd.Timestamp(t).to_pydatetime(),
            zone,
            float(v),
            "mw",
            pd.Timestamp(t).to_pydatetime() + HOUR + CURTAILMENT_LAG,
            source,
            SignalKind.CURTAILMENT,
        )
        for t, v in per_hour.items()
    ]


class _GridstatusSource(KeyedSource):
    """Reads one local day at a time through gridstatus (imported on first use)."""

    history: ClassVar[bool] = True
    spec: ClassVar[IsoSpec]

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        locations: Mapping[str, str] = ctx.options.get("iso_locations", {}) or {}
        self.location = str(locations.get(self.name, self.spec.location))

    def covers(self, key: str) -> bool:
        return key == self.spec.zone

    def _client(self) -> Any:
        gs = require(self.name, "gridstatus", GRID_EXTRA)
        creds = [self.ctx.credential(self.name, env) for env in self.spec.credentials]
        REDACTOR.add(creds)  # gridstatus logs PJM's request headers at INFO
        cls = getattr(gs, self.spec.iso)
        if self.spec.iso == "PJM":
            return cls(api_key=creds[0], retries=0)  # retries are ours (library.call)
        return cls()

    def _day(
        self, what: str, fetch: Callable[[], pd.DataFrame], attempts: int = ATTEMPTS
    ) -> pd.DataFrame | None:
        no_data = _no_data_type(self.name)

        def once() -> pd.DataFrame | None:
            try:
                return fetch()
            except no_data:
                return None

        try:
            got = call(
                self.name,
                what,
                once,
                sleep=self.ctx.sleep,
                attempts=attempts,
                hint=" / ".join(f"check ${c}" for c in self.spec.credentials),
            )
        except RequestRejected as exc:
            if exc.status != 404:  # a day not published yet (tomorrow, or a late report)
                raise
            got = None
        if got is None:
            logger.info("%s: %s: not published", self.name, what)
        return got


class IsoPrices(_GridstatusSource):
    """Day-ahead hourly LMP at the hub of one ISO (`ISO_SPECS`), keyed by its grid zone."""

    kind: ClassVar[SignalKind] = SignalKind.POWER_PRICE
    back: ClassVar[timedelta] = timedelta(hours=24)
    ahead: ClassVar[timedelta] = timedelta(hours=48)

    def _fetch(self, client: Any, day: pd.Timestamp) -> pd.DataFrame:
        iso = self.spec.iso
        if iso == "CAISO":
            frame: pd.DataFrame = client.get_lmp(
                day, market="DAY_AHEAD_HOURLY", locations=[self.location], sleep=0
            )
        elif iso == "NYISO":
            frame = client.get_lmp(
                day, market="DAY_AHEAD_HOURLY", locations=[self.location], location_type="zone"
            )
        elif iso == "PJM":
            frame = client.get_lmp(day, market="DAY_AHEAD_HOURLY", locations=[self.location])
        elif iso == "Ercot":
            frame = client.get_spp(
                day,
                market="DAY_AHEAD_HOURLY",
                locations=[self.location],
                location_type="Trading Hub",
            )
        else:
            frame = client.get_lmp_day_ahead_hourly(day)
        return frame

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        if key != self.spec.zone:
            raise MalformedResponse(self.name, "key", f"only {self.spec.zone!r} is covered")
        client = self._client()
        price_col = "SPP" if self.spec.iso == "Ercot" else "LMP"
        tomorrow = self.ctx.clock.now().astimezone(ZoneInfo(self.spec.tz)).date() + timedelta(1)
        out: list[Obs] = []
        for day in _local_days(start, end, self.spec.tz, self.name):
            if day > tomorrow:  # a day-ahead market publishes tomorrow at the latest
                break
            ts = pd.Timestamp(day).tz_localize(self.spec.tz)
            try:
                frame = self._day(
                    f"day-ahead prices {day}",
                    lambda ts=ts: self._fetch(client, ts),  # type: ignore[misc]
                    attempts=1 if day == tomorrow else ATTEMPTS,
                )
            except (SourceUnavailable, MalformedResponse) as exc:
                if day < tomorrow:
                    raise
                # tomorrow's prices appear in the afternoon; some ISOs (ISO-NE) answer an
                # unpublished day with an error page: not published yet, a gap
                logger.info("%s: tomorrow (%s) not published: %s", self.name, day, exc)
                continue
            if frame is not None:
                out.extend(
                    lmp_obs(
                        frame,
                        self.location,
                        key,
                        self.name,
                        f"lmp {day}",
                        price_col,
                        self.spec.location_column,
                    )
                )
        return out


class CaisoCurtailment(_GridstatusSource):
    """CAISO wind and solar curtailment from its daily renewables report, per local day
    (the report for a day appears the next morning)."""

    name: ClassVar[str] = "caiso-curtailment"
    terms: ClassVar[str] = "CAISO public data"
    kind: ClassVar[SignalKind] = SignalKind.CURTAILMENT
    back: ClassVar[timedelta] = timedelta(days=2)
    spec: ClassVar[IsoSpec] = IsoSpec(
        "CAISO", CAISO_ZONE, "", "US/Pacific", terms="CAISO public data"
    )

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        if key != CAISO_ZONE:
            raise MalformedResponse(self.name, "key", f"only {CAISO_ZONE!r} is covered")
        client = self._client()
        out: list[Obs] = []
        for day in _local_days(start, end, self.spec.tz, self.name):
            ts = pd.Timestamp(day).tz_localize(self.spec.tz)
            frame = self._day(f"renewables report {day}", lambda ts=ts: client.get_curtailment(ts))  # type: ignore[misc]
            if frame is not None:
                out.extend(curtailment_obs(frame, day, self.spec.tz, self.name))
        return out


def _price_class(name: str, spec: IsoSpec) -> type[IsoPrices]:
    cls = type(
        f"IsoPrices_{spec.iso}",
        (IsoPrices,),
        {"name": name, "spec": spec, "terms": spec.terms, "__doc__": IsoPrices.__doc__},
    )
    return cls


PRICE_SOURCES: Final[Mapping[str, type[IsoPrices]]] = {
    name: _price_class(name, spec) for name, spec in ISO_SPECS.items()
}

__all__ = [
    "ISO_SPECS",
    "PRICE_SOURCES",
    "ZONE_TO_ISO",
    "CaisoCurtailment",
    "IsoPrices",
    "IsoSpec",
    "curtailment_obs",
    "lmp_obs",
]
