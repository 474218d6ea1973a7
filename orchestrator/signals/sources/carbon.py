"""Carbon intensity: Electricity Maps v3, WattTime v3 and the UK Carbon Intensity API.

Both kinds are kept apart: Electricity Maps and the UK API give the location-based average
(unit ``g_co2_per_kwh``, trace metric ``carbon_avg_g_per_kwh``), WattTime the marginal
operating emissions rate (``g_co2_per_kwh_marginal``, converted from lbs/MWh with
`orchestrator.units.g_per_kwh_from_lbs_per_mwh`) and a relative signal index
(``percentile``, kept in the state store only). Forecasts carry the source suffix
``-forecast``: they are stored, never written into a trace as observations.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import ClassVar, Final

from pydantic import Field

from orchestrator import units
from orchestrator.model import SignalKind
from orchestrator.signals.sources.base import (
    FORECAST_SUFFIX,
    KeyedSource,
    Obs,
    SourceContext,
    Strict,
    Time,
    decode_json,
    finite_or_nan,
    validate,
)
from orchestrator.signals.sources.errors import AuthFailed, MalformedResponse, short

logger = logging.getLogger(__name__)

HOUR: Final = timedelta(hours=1)


def _iso_z(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- Electricity Maps v3 ------------------------------------------------------------------

EM_DEFAULT_URL: Final = "https://api.electricitymap.org/v3"
EM_TOKEN_ENV: Final = "ELECTRICITYMAPS_TOKEN"
EM_PAST_RANGE_MAX: Final = timedelta(days=10)  # past-range answers at most 10 days hourly
EM_VALID_FOR: Final = 2 * HOUR  # the hour it describes plus an hour of publication lag


class EmPoint(Strict):
    carbonIntensity: float | None = Field(ge=0)  # noqa: N815 - the API's name
    datetime: Time


class EmLatest(EmPoint):
    zone: str


class EmHistory(Strict):
    zone: str
    history: list[EmPoint]


class EmRange(Strict):
    zone: str
    data: list[EmPoint]


class EmForecastPoint(Strict):
    carbonIntensity: float = Field(ge=0)  # noqa: N815
    datetime: Time


class EmForecast(Strict):
    zone: str
    forecast: list[EmForecastPoint]


def _em_zone(got: str, want: str, source: str) -> None:
    if got != want:
        raise MalformedResponse(source, "zone", f"expected {want!r}, got {short(got)}")


def parse_em_history(body: bytes | str, zone: str, source: str = "electricitymaps") -> list[Obs]:
    """`/carbon-intensity/history` (the last 24 h) or `/past-range` (``data``)."""
    raw = decode_json(body, source)
    if isinstance(raw, dict) and "data" in raw and "history" not in raw:
        points = validate(EmRange, raw, source)
        _em_zone(points.zone, zone, source)
        items = points.data
        prefix = "data"
    else:
        hist = validate(EmHistory, raw, source)
        _em_zone(hist.zone, zone, source)
        items = hist.history
        prefix = "history"
    del prefix
    return [
        Obs(
            time=p.datetime.astimezone(UTC),
            key=zone,
            value=finite_or_nan(p.carbonIntensity),
            unit="g_co2_per_kwh",
            valid_until=p.datetime.astimezone(UTC) + EM_VALID_FOR,
            source=source,
        )
        for p in items
    ]


def parse_em_latest(body: bytes | str, zone: str, source: str = "electricitymaps") -> list[Obs]:
    p = validate(EmLatest, decode_json(body, source), source)
    _em_zone(p.zone, zone, source)
    when = p.datetime.astimezone(UTC)
    return [
        Obs(
            when,
            zone,
            finite_or_nan(p.carbonIntensity),
            "g_co2_per_kwh",
            when + EM_VALID_FOR,
            source,
        )
    ]


def parse_em_forecast(body: bytes | str, zone: str, source: str = "electricitymaps") -> list[Obs]:
    fc = validate(EmForecast, decode_json(body, source), source)
    _em_zone(fc.zone, zone, source)
    return [
        Obs(
            time=p.datetime.astimezone(UTC),
            key=zone,
            value=p.carbonIntensity,
            unit="g_co2_per_kwh",
            valid_until=p.datetime.astimezone(UTC) + HOUR,
            source=source + FORECAST_SUFFIX,
        )
        for p in fc.forecast
    ]


class ElectricityMaps(KeyedSource):
    """Electricity Maps v3 carbon intensity per zone (token in ``auth-token``).

    The last 24 h come from ``/carbon-intensity/history``, older windows from
    ``/carbon-intensity/past-range`` (10 days a request), the future from
    ``/carbon-intensity/forecast`` (skipped with a warning when the plan lacks it).
    """

    name: ClassVar[str] = "electricitymaps"
    terms: ClassVar[str] = "Electricity Maps API terms (ODbL for exports): check your plan"
    kind: ClassVar[SignalKind] = SignalKind.CARBON
    history: ClassVar[bool] = True
    back: ClassVar[timedelta] = timedelta(hours=24)
    ahead: ClassVar[timedelta] = timedelta(hours=24)
    default_url: ClassVar[str] = EM_DEFAULT_URL

    def _get(self, path: str, params: Mapping[str, str]) -> bytes:
        token = self.ctx.credential(self.name, EM_TOKEN_ENV)
        return self.ctx.http.get(
            self.name,
            f"{self.url}{path}",
            params=params,
            headers={"auth-token": token},
            secrets=(token,),
            auth_hint=f"check ${EM_TOKEN_ENV}",
        ).body

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        now = self.ctx.clock.now()
        out: list[Obs] = []
        past_end = min(end, now)
        if start <= past_end:
            if start >= now - timedelta(hours=24):
                body = self._get("/carbon-intensity/history", {"zone": key})
                out.extend(parse_em_history(body, key, self.name))
            else:
                lo = start
                while lo < past_end:
                    hi = min(lo + EM_PAST_RANGE_MAX, past_end)
                    body = self._get(
                        "/carbon-intensity/past-range",
                        {"zone": key, "start": _iso_z(lo), "end": _iso_z(hi)},
                    )
                    out.extend(parse_em_history(body, key, self.name))
                    lo = hi
        if end > now:
            try:
                body = self._get("/carbon-intensity/forecast", {"zone": key})
            except AuthFailed as exc:
                logger.warning("%s: no forecast for %s (%s)", self.name, key, exc)
            else:
                out.extend(o for o in parse_em_forecast(body, key, self.name) if o.time <= end)
        return out


# -- UK Carbon Intensity API --------------------------------------------------------------

UK_DEFAULT_URL: Final = "https://api.carbonintensity.org.uk"
UK_ZONE: Final = "GB"
UK_RANGE_MAX: Final = timedelta(days=14)
UK_LAG: Final = HOUR


class UkIntensity(Strict):
    forecast: float | None = Field(default=None, ge=0)
    actual: float | None = Field(default=None, ge=0)
    index: str | None = None


class UkPeriod(Strict):
    from_: Time = Field(alias="from")
    to: Time
    intensity: UkIntensity


class UkResponse(Strict):
    data: list[UkPeriod]


def _uk_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")


def parse_uk_intensity(body: bytes | str, source: str = "uk-carbon") -> list[Obs]:
    """`/intensity[/from/to|/from/fw24h]`: half-hours of national intensity. ``actual``
    is the observation; where it is null the half-hour's forecast is kept as a forecast."""
    resp = validate(UkResponse, decode_json(body, source), source)
    out: list[Obs] = []
    for i, period in enumerate(resp.data):
        start = period.from_.astimezone(UTC)
        stop = period.to.astimezone(UTC)
        if stop <= start:
            raise MalformedResponse(
                source, f"data[{i}].to", f"expected a time after 'from', got {stop.isoformat()}"
            )
        if period.intensity.actual is not None:
            out.append(
                Obs(start, UK_ZONE, period.intensity.actual, "g_co2_per_kwh", stop + UK_LAG, source)
            )
        elif period.intensity.forecast is not None:
            out.append(
                Obs(
                    start,
                    UK_ZONE,
                    period.intensity.forecast,
                    "g_co2_per_kwh",
                    stop,
                    source + FORECAST_SUFFIX,
                )
            )
        else:
            out.append(Obs(start, UK_ZONE, float("nan"), "g_co2_per_kwh", stop, source))
    return out


class UkCarbon(KeyedSource):
    """National Grid ESO's Carbon Intensity API for Great Britain (no key; half-hourly)."""

    name: ClassVar[str] = "uk-carbon"
    terms: ClassVar[str] = "CC BY 4.0 (National Energy System Operator, carbonintensity.org.uk)"
    kind: ClassVar[SignalKind] = SignalKind.CARBON
    history: ClassVar[bool] = True
    back: ClassVar[timedelta] = timedelta(hours=24)
    ahead: ClassVar[timedelta] = timedelta(hours=24)
    default_url: ClassVar[str] = UK_DEFAULT_URL

    def covers(self, key: str) -> bool:
        return key == UK_ZONE

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        if key != UK_ZONE:
            raise MalformedResponse(self.name, "key", f"only {UK_ZONE!r} is covered, got {key!r}")
        now = self.ctx.clock.now()
        out: list[Obs] = []
        lo, past_end = start, min(end, now)
        while lo < past_end:
            hi = min(lo + UK_RANGE_MAX, past_end)
            url = f"{self.url}/intensity/{_uk_time(lo)}/{_uk_time(hi)}"
            out.extend(parse_uk_intensity(self.ctx.http.get(self.name, url).body, self.name))
            lo = hi
        if end > now:
            url = f"{self.url}/intensity/{_uk_time(now)}/fw24h"
            got = parse_uk_intensity(self.ctx.http.get(self.name, url).body, self.name)
            out.extend(
                Obs(
                    o.time,
                    o.key,
                    o.value,
                    o.unit,
                    o.valid_until,
                    o.source if o.source.endswith(FORECAST_SUFFIX) else o.source + FORECAST_SUFFIX,
                )
                for o in got
                if o.time > now - timedelta(minutes=30)
            )
        return out


# -- WattTime v3 --------------------------------------------------------------------------

WT_DEFAULT_URL: Final = "https://api.watttime.org"
WT_USER_ENV: Final = "WATTTIME_USERNAME"
WT_PASSWORD_ENV: Final = "WATTTIME_PASSWORD"
WT_SIGNAL: Final = "co2_moer"
WT_LBS_UNIT: Final = "lbs_co2_per_mwh"
WT_LAG: Final = timedelta(minutes=30)
# Electricity Maps zone -> WattTime region (WattTime "Grid regions" map; regions are looked
# up by location with /v3/region-from-loc). Extend with options["watttime_regions"].
ZONE_TO_WATTTIME: Final[Mapping[str, str]] = {
    "US-CAL-CISO": "CAISO_NORTH",  # northern California, the free-plan region
    "US-NW-BPAT": "BPA",  # Bonneville Power Administration
    "US-MIDA-PJM": "PJM_DC",  # PJM, Washington DC / northern Virginia area
}


class WtLogin(Strict):
    token: str = Field(min_length=8)


class WtPoint(Strict):
    point_time: Time
    value: float = Field(ge=0)


class WtMeta(Strict):
    region: str | None = None
    signal_type: str | None = None
    units: str
    data_point_period_seconds: float | None = Field(default=None, gt=0)


class WtData(Strict):
    data: list[WtPoint]
    meta: WtMeta


def _wt_rows(
    body: bytes | str, zone: str, unit_expected: str, source: str
) -> tuple[list[WtPoint], timedelta]:
    resp = validate(WtData, decode_json(body, source), source)
    if resp.meta.units != unit_expected:
        raise MalformedResponse(
            source, "meta.units", f"expected {unit_expected!r}, got {short(resp.meta.units)}"
        )
    if resp.meta.signal_type not in (None, WT_SIGNAL):
        raise MalformedResponse(
            source,
            "meta.signal_type",
            f"expected {WT_SIGNAL!r}, got {short(resp.meta.signal_type)}",
        )
    del zone
    period = timedelta(seconds=resp.meta.data_point_period_seconds or 300)
    return resp.data, period


def parse_wt_moer(
    body: bytes | str, zone: str, *, forecast: bool, source: str = "watttime"
) -> list[Obs]:
    """`/v3/historical` or `/v3/forecast`: MOER in lbs/MWh -> g/kWh."""
    points, period = _wt_rows(body, zone, WT_LBS_UNIT, source)
    name = source + (FORECAST_SUFFIX if forecast else "")
    return [
        Obs(
            time=p.point_time.astimezone(UTC),
            key=zone,
            value=units.g_per_kwh_from_lbs_per_mwh(p.value),
            unit="g_co2_per_kwh_marginal",
            valid_until=p.point_time.astimezone(UTC)
            + period
            + (timedelta(0) if forecast else WT_LAG),
            source=name,
        )
        for p in points
    ]


def parse_wt_index(body: bytes | str, zone: str, source: str = "watttime") -> list[Obs]:
    """`/v3/signal-index`: the current MOER as a percentile of the coming day (0..100)."""
    points, period = _wt_rows(body, zone, "percentile", source)
    out = []
    for i, p in enumerate(points):
        if p.value > 100:
            raise MalformedResponse(
                source, f"data[{i}].value", f"expected a percentile 0..100, got {p.value}"
            )
        when = p.point_time.astimezone(UTC)
        out.append(
            Obs(when, zone, p.value, "percentile", when + period + WT_LAG, source + "-index")
        )
    return out


class WattTime(KeyedSource):
    """WattTime v3: log in (HTTP basic) for a bearer token, then per region the co2_moer
    signal index, historical MOER (past) and forecast (future)."""

    name: ClassVar[str] = "watttime"
    terms: ClassVar[str] = "WattTime terms: data may not be redistributed"
    kind: ClassVar[SignalKind] = SignalKind.CARBON
    history: ClassVar[bool] = True
    back: ClassVar[timedelta] = timedelta(hours=1)
    ahead: ClassVar[timedelta] = timedelta(hours=24)

    default_url: ClassVar[str] = WT_DEFAULT_URL

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        extra = ctx.options.get("watttime_regions") or {}
        self.regions: dict[str, str] = {**ZONE_TO_WATTTIME, **dict(extra)}
        self._token: str | None = None

    def covers(self, key: str) -> bool:
        return key in self.regions

    def _login(self) -> str:
        if self._token is None:
            user = self.ctx.credential(self.name, WT_USER_ENV)
            password = self.ctx.credential(self.name, WT_PASSWORD_ENV)
            body = self.ctx.http.get(
                self.name,
                f"{self.url}/login",
                auth=(user, password),
                what="login",
                auth_hint=f"check ${WT_USER_ENV} / ${WT_PASSWORD_ENV}",
            ).body
            self._token = validate(WtLogin, decode_json(body, self.name), self.name).token
        return self._token

    def _get(self, path: str, params: Mapping[str, str]) -> bytes:
        token = self._login()
        return self.ctx.http.get(
            self.name,
            f"{self.url}{path}",
            params=params,
            headers={"Authorization": f"Bearer {token}"},
            secrets=(token,),
            auth_hint="the plan may not include this region or signal",
        ).body

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        region = self.regions.get(key)
        if region is None:
            raise MalformedResponse(
                self.name,
                "key",
                f"no WattTime region known for zone {key!r}; "
                "add it with options['watttime_regions']",
            )
        now = self.ctx.clock.now()
        base = {"region": region, "signal_type": WT_SIGNAL}
        out: list[Obs] = []
        past_end = min(end, now)
        if start < past_end:
            body = self._get(
                "/v3/historical", {**base, "start": _iso_z(start), "end": _iso_z(past_end)}
            )
            out.extend(parse_wt_moer(body, key, forecast=False, source=self.name))
        if start <= now <= end:
            out.extend(parse_wt_index(self._get("/v3/signal-index", base), key, self.name))
        if end > now:
            hours = max(1, min(72, int((end - now).total_seconds() // 3600) or 1))
            body = self._get("/v3/forecast", {**base, "horizon_hours": str(hours)})
            out.extend(
                o
                for o in parse_wt_moer(body, key, forecast=True, source=self.name)
                if o.time <= end
            )
        return out
