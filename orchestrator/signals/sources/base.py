"""What every live signal source shares: the frame it returns, its context, validation.

A source is a small class with `name`, `kind` and ``read(keys, start, end) -> DataFrame``
(the `SignalSource` protocol of DESIGN.md §3). Its frame has the columns `FRAME_COLUMNS`:

- ``time``: start of the interval the value describes (tz-aware UTC);
- ``key``: a grid zone (Electricity Maps id) for grid signals, `price_key(...)` for prices,
  `spot_key(...)` for spot availability;
- ``kind``: an `orchestrator.model.SignalKind` value; ``unit``: see `UNITS`;
- ``value``: float, NaN = unknown (the source had no value: never a stale one);
- ``source``: the source name; forecasts carry the suffix ``-forecast``;
- ``observed_at``: when Heliotrope read it; ``valid_until``: after this the value is unknown.

`read` raises on the first failing key; `read_partial` returns what it could read and the
error of each key that failed (a poll reports both). Keys are always Heliotrope keys (grid
zones or cloud regions); each source maps them to its own area codes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Final, Protocol, TypeVar

import pandas as pd
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, ValidationError

from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError
from orchestrator.model import SignalKind
from orchestrator.signals.sources.errors import (
    AuthFailed,
    MalformedResponse,
    MissingCredential,
    short,
)
from orchestrator.signals.sources.http import HttpClient
from orchestrator.state.records import SAMPLE_COLUMNS

# A source's frame is a samples frame: the state store appends it as it is.
FRAME_COLUMNS: Final = SAMPLE_COLUMNS
FORECAST_SUFFIX: Final = "-forecast"

# unit -> meaning. Grid units map onto trace metrics in `tracemap.GRID_METRIC`.
UNITS: Final[Mapping[str, str]] = {
    "usd_per_hour": "USD per instance-hour (whole instance)",
    "instances": "instances obtainable (0 = none)",
    "placement_score": "AWS spot placement score, 1 (unlikely) .. 10 (very likely)",
    "interruption_pct_max": "AWS Spot Advisor: upper bound of the monthly interruption band, %",
    "savings_pct": "AWS Spot Advisor: spot saving over on-demand, %",
    "g_co2_per_kwh": "gCO2(eq)/kWh, location-based average",
    "g_co2_per_kwh_marginal": "gCO2/kWh, marginal operating emissions rate",
    "percentile": "WattTime co2_moer signal index, 0..100 (relative, no unit)",
    "mw": "MW (hourly average)",
    "usd_per_mwh": "USD/MWh wholesale price (negative prices kept)",
}


class SignalSource(Protocol):
    """DESIGN.md §3: one live signal. `history` says whether `read` reaches back in time
    (for `heliotrope traces download`)."""

    name: str
    kind: SignalKind
    history: bool
    terms: str  # the data's licence or terms of use, for the trace manifest

    def read(self, keys: Sequence[str], start: datetime, end: datetime) -> pd.DataFrame: ...

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]: ...

    def default_keys(self, regions: Sequence[tuple[str, str]]) -> list[str]: ...

    def poll_window(self, now: datetime) -> tuple[datetime, datetime]: ...


# -- context ------------------------------------------------------------------------------


class FixedClock:
    """A clock stopped at `now`: one poll sees one time."""

    def __init__(self, now: datetime) -> None:
        self._now = utc(now)

    def now(self) -> datetime:
        return self._now

    def sleep(self, seconds: float) -> None:
        del seconds


@dataclass
class SourceContext:
    """What a source needs from outside: HTTP, the clock, credentials and base URLs.

    `credentials` maps environment-variable names (``ELECTRICITYMAPS_TOKEN``) to values; a
    name not in it is looked up in `env` (default: the process environment). `base_urls`
    maps a source name to its base URL; else ``HELIOTROPE_<NAME>_URL`` in `env`, else the
    public default.
    """

    http: HttpClient = field(default_factory=HttpClient)
    clock: Clock = field(default_factory=SystemClock)
    credentials: Mapping[str, str] = field(default_factory=dict)
    base_urls: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    sleep: Callable[[float], None] = time.sleep  # how AWS retries wait (HTTP: `http`'s own)

    def _env(self) -> Mapping[str, str]:
        return os.environ if self.env is None else self.env

    def credential(self, source: str, name: str) -> str:
        value = self.credentials.get(name) or self._env().get(name) or ""
        if not value.strip():
            raise MissingCredential(source, name)
        return value.strip()

    def grid_zones(self) -> list[str]:
        """Grid zones to read beyond those of the polled regions (zones no catalog region
        draws from, e.g. NYISO's): ``options["grid_zones"]`` or ``HELIOTROPE_GRID_ZONES``
        (comma-separated)."""
        given = self.options.get("grid_zones")
        if given is None:
            given = self._env().get("HELIOTROPE_GRID_ZONES", "")
        items = given.split(",") if isinstance(given, str) else [str(z) for z in given]
        return [z.strip() for z in items if z.strip()]

    def base_url(self, source: str, default: str) -> str:
        env_name = f"HELIOTROPE_{source.upper().replace('-', '_')}_URL"
        url = self.base_urls.get(source) or self._env().get(env_name) or default
        return url.rstrip("/")


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# -- rows and frames ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Obs:
    """One observed value before it becomes a frame row (`observed_at` is added then)."""

    time: datetime
    key: str
    value: float
    unit: str
    valid_until: datetime
    source: str
    kind: SignalKind | None = None  # None: the source's kind


def empty_frame() -> pd.DataFrame:
    return make_frame([], SignalKind.CARBON, datetime(1970, 1, 1, tzinfo=UTC))


def make_frame(rows: Sequence[Obs], kind: SignalKind, observed_at: datetime) -> pd.DataFrame:
    """The `FRAME_COLUMNS` frame of `rows`, sorted by time and key."""
    frame = pd.DataFrame(
        {
            "time": pd.to_datetime([r.time for r in rows], utc=True),
            "key": pd.Series([r.key for r in rows], dtype="object"),
            "kind": pd.Series([(r.kind or kind).value for r in rows], dtype="object"),
            "value": pd.Series([r.value for r in rows], dtype="float64"),
            "unit": pd.Series([r.unit for r in rows], dtype="object"),
            "source": pd.Series([r.source for r in rows], dtype="object"),
            "observed_at": pd.to_datetime([utc(observed_at)] * len(rows), utc=True),
            "valid_until": pd.to_datetime([r.valid_until for r in rows], utc=True),
        },
        columns=list(FRAME_COLUMNS),
    )
    for col in ("time", "observed_at", "valid_until"):
        frame[col] = frame[col].dt.as_unit("ns")
    return frame.sort_values(["time", "key", "unit"], kind="stable").reset_index(drop=True)


def concat_frames(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    kept = [f for f in frames if len(f)]
    if not kept:
        return empty_frame()
    return (
        pd.concat(kept, ignore_index=True)
        .sort_values(["time", "key", "unit"], kind="stable")
        .reset_index(drop=True)
    )


class ReadsAll:
    """`read`, for a source that implements `read_partial`: everything, or its first error."""

    def read(self, keys: Sequence[str], start: datetime, end: datetime) -> pd.DataFrame:
        frame, errors = self.read_partial(keys, start, end)
        if errors:
            raise next(iter(errors.values()))
        return frame

    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        raise NotImplementedError


class KeyedSource(ReadsAll):
    """A source read one key at a time: subclasses implement `_read_key`.

    An `AuthFailed` or `MissingCredential` stops the loop (every key would fail the same
    way); other errors are kept per key and the next key is read.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[SignalKind] = SignalKind.CARBON
    history: ClassVar[bool] = False
    terms: ClassVar[str] = ""
    back: ClassVar[timedelta] = timedelta(hours=24)
    ahead: ClassVar[timedelta] = timedelta(0)
    default_url: ClassVar[str] = ""  # its API's base URL (`url`: this or the configured one)

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx
        self.url = ctx.base_url(self.name, self.default_url) if self.default_url else ""

    # -- the protocol -------------------------------------------------------------------
    def read_partial(
        self, keys: Sequence[str], start: datetime, end: datetime
    ) -> tuple[pd.DataFrame, dict[str, HeliotropeError]]:
        start, end = utc(start), utc(end)
        observed_at = self.ctx.clock.now()
        rows: list[Obs] = []
        errors: dict[str, HeliotropeError] = {}
        for key in keys:
            try:
                got = self._read_key(key, start, end)
            except (AuthFailed, MissingCredential) as exc:
                errors[key] = exc
                break
            except HeliotropeError as exc:
                errors[key] = exc
                continue
            rows.extend(
                o for o in got if start <= o.time <= end or o.source.endswith(FORECAST_SUFFIX)
            )
        return make_frame(rows, self.kind, observed_at), errors

    def default_keys(self, regions: Sequence[tuple[str, str]]) -> list[str]:
        from orchestrator import catalog

        zones = {catalog.grid_zone(c, r) for c, r in regions} | set(self.ctx.grid_zones())
        return sorted(z for z in zones if z and self.covers(z))

    def covers(self, key: str) -> bool:
        del key
        return True

    def poll_window(self, now: datetime) -> tuple[datetime, datetime]:
        now = utc(now)
        return now - self.back, now + self.ahead

    # -- for subclasses -----------------------------------------------------------------
    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        raise NotImplementedError


# -- parsing helpers ----------------------------------------------------------------------


EARLIEST: Final = datetime(1990, 1, 1, tzinfo=UTC)
LATEST: Final = datetime(2200, 1, 1, tzinfo=UTC)


def check_time(when: datetime) -> datetime:
    """A time within 1990..2200 (pandas and arithmetic stay in range), else ValueError."""
    if not EARLIEST <= when <= LATEST:
        raise ValueError(f"a time between 1990 and 2200, got {when.isoformat()}")
    return when


# An ISO 8601 time with a UTC offset, in a sane range. Naive times are refused.
Time = Annotated[AwareDatetime, AfterValidator(check_time)]


class Strict(BaseModel):
    """Base of every response model: unknown fields ignored, NaN and infinities rejected."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)


M = TypeVar("M", bound=BaseModel)


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """`data` as `model`, or `MalformedResponse` naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0] if errors else {"loc": (), "msg": str(exc)[:120]}
        field_name = _loc(first.get("loc", ()))
        where = ".".join(p for p in (prefix, field_name) if p) if field_name else prefix
        got = first.get("input")
        reason = str(first.get("msg", "invalid"))
        if got is not None and not isinstance(got, dict | list):
            reason += f", got {short(got)}"
        raise MalformedResponse(source, where, reason) from None
    except (RecursionError, ValueError, TypeError) as exc:
        raise MalformedResponse(source, prefix, type(exc).__name__) from None


def decode_json(body: bytes | str, source: str, what: str = "body") -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise MalformedResponse(source, what, f"not JSON ({type(exc).__name__})") from None


def parse_utc(text: object, source: str, field_name: str) -> datetime:
    """An ISO 8601 time with an offset (``Z`` or ``+01:00``) as UTC. A time without an
    offset is refused: guessing local time is how daylight-saving bugs happen."""
    if isinstance(text, datetime):
        when = text
    else:
        if not isinstance(text, str):
            raise MalformedResponse(source, field_name, f"expected a time, got {short(text)}")
        raw = text.strip()
        try:
            when = datetime.fromisoformat(raw)
        except ValueError:
            raise MalformedResponse(
                source, field_name, f"expected an ISO 8601 time, got {short(text)}"
            ) from None
    if when.tzinfo is None:
        raise MalformedResponse(
            source, field_name, f"expected a time with a UTC offset, got {short(text)}"
        )
    try:
        return check_time(when.astimezone(UTC))
    except (ValueError, OverflowError):
        raise MalformedResponse(source, field_name, f"out of range: {short(text)}") from None


def finite_or_nan(value: float | None) -> float:
    """None (the source has no value) -> NaN: unknown."""
    return math.nan if value is None else float(value)
