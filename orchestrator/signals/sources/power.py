"""Curtailment, wholesale power prices and generation mix.

- `Entsoe`: ENTSO-E Transparency Platform day-ahead prices (document A44), fetched with
  entsoe-py's raw client (the ``entsoe`` extra) and validated here as XML; prices in
  EUR/MWh converted to USD at a fixed, documented rate; negative prices kept (a curtailment
  proxy). Bidding zones are mapped to Electricity Maps zone ids by `ZONE_TO_EIC`.
- `EntsoeGeneration`: ENTSO-E actual generation per production type (A75), through
  entsoe-py's client and parser, as a production-based average intensity (like EIA-930).
- `Eia930`: EIA-930 hourly net generation by fuel type (API v2, paginated) for US balancing
  areas, turned into a production-based average intensity with `EMISSION_FACTORS`.
- `parse_caiso_report`: CAISO's daily wind and solar curtailment table (hour ending,
  Pacific time) in its CSV form, summed per hour into ``curtailment_mw`` for US-CAL-CISO.
  The live source, `isos.CaisoCurtailment`, reads CAISO's own daily report through
  gridstatus.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any, ClassVar, Final

import numpy as np
import pandas as pd
from pydantic import Field

from orchestrator.model import SignalKind
from orchestrator.signals.importers.power import (
    CAISO_ZONE,
    EUR_TO_USD,
    caiso_hour_start_utc,
)
from orchestrator.signals.sources.base import (
    KeyedSource,
    Obs,
    SourceContext,
    Strict,
    check_time,
    decode_json,
    validate,
)
from orchestrator.signals.sources.errors import MalformedResponse, short
from orchestrator.signals.sources.http import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    REDACTOR,
)
from orchestrator.signals.sources.library import call, require

logger = logging.getLogger(__name__)

HOUR: Final = timedelta(hours=1)

# -- ENTSO-E day-ahead prices -------------------------------------------------------------

ENTSOE_DEFAULT_URL: Final = "https://web-api.tp.entsoe.eu/api"
ENTSOE_TOKEN_ENV: Final = "ENTSOE_TOKEN"
ENTSOE_EXTRA: Final = "entsoe"
ENTSOE_CHUNK: Final = timedelta(days=31)
# Electricity Maps zone id -> ENTSO-E bidding zone (EIC code), from the ENTSO-E area codes
# (Transparency Platform "Areas" list, as entsoe-py's mappings carry them).
ZONE_TO_EIC: Final[Mapping[str, str]] = {
    "AT": "10YAT-APG------L",  # Austria
    "BE": "10YBE----------2",  # Belgium
    "CH": "10YCH-SWISSGRIDZ",  # Switzerland
    "DE": "10Y1001A1001A82H",  # the DE-LU bidding zone (since 2018-10-01)
    "DK-DK1": "10YDK-1--------W",  # Denmark West
    "DK-DK2": "10YDK-2--------M",  # Denmark East
    "ES": "10YES-REE------0",  # Spain
    "FI": "10YFI-1--------U",  # Finland
    "FR": "10YFR-RTE------C",  # France
    "IE": "10Y1001A1001A59C",  # the SEM (Ireland and Northern Ireland)
    "IT-NO": "10Y1001A1001A73I",  # Italy North
    "NL": "10YNL----------L",  # Netherlands
    "NO-NO1": "10YNO-1--------2",  # Norway NO1
    "PL": "10YPL-AREA-----S",  # Poland
    "PT": "10YPT-REN------W",  # Portugal
    "SE-SE3": "10Y1001A1001A46L",  # Sweden SE3 (Stockholm)
    "SE-SE4": "10Y1001A1001A47J",  # Sweden SE4
}
_RESOLUTION = re.compile(r"^PT(\d+)M$")
_MAX_ENTSOE_POINTS: Final = 200_000


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _child(elem: ET.Element, name: str) -> ET.Element | None:
    for c in elem:
        if _local(c.tag) == name:
            return c
    return None


def _children(elem: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in elem if _local(c.tag) == name]


def _text(elem: ET.Element, path: str, source: str, where: str) -> str:
    node: ET.Element | None = elem
    for part in path.split("/"):
        node = _child(node, part) if node is not None else None
    if node is None or node.text is None or not node.text.strip():
        raise MalformedResponse(source, f"{where}.{path.replace('/', '.')}", "missing")
    return node.text.strip()


def _xml_root(body: bytes | str, source: str) -> ET.Element:
    raw = body.encode() if isinstance(body, str) else body
    head = raw[:4096].upper()
    if b"<!DOCTYPE" in head or b"<!ENTITY" in raw.upper():
        raise MalformedResponse(source, "body", "XML with a DTD or entities is refused")
    try:
        return ET.fromstring(raw)
    except (ET.ParseError, ValueError, RecursionError) as exc:
        raise MalformedResponse(source, "body", f"not XML ({type(exc).__name__})") from None


def _eic_time(text: str, source: str, where: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise MalformedResponse(source, where, f"expected a UTC time, got {short(text)}") from None
    if when.tzinfo is None:
        raise MalformedResponse(source, where, f"expected a UTC time, got {short(text)}")
    try:
        return check_time(when.astimezone(UTC))
    except (ValueError, OverflowError):
        raise MalformedResponse(source, where, f"out of range: {short(text)}") from None


def _entsoe_refused(root: ET.Element, source: str) -> None:
    """An Acknowledgement_MarketDocument: "no matching data" (code 999) returns, any other
    reason raises."""
    reason = _child(root, "Reason")
    code = _text(reason, "code", source, "Reason") if reason is not None else ""
    if code == "999":  # "No matching data found"
        return
    text = ""
    if reason is not None and (t := _child(reason, "text")) is not None:
        text = (t.text or "").strip()[:200]
    raise MalformedResponse(source, "Reason", f"request refused: code {code} {text}".strip())


def _entsoe_rate(series: ET.Element, eur_to_usd: float, source: str, where: str) -> float:
    """USD per unit of a TimeSeries' currency (its prices must be per MWh)."""
    currency = _text(series, "currency_Unit.name", source, where)
    unit = _text(series, "price_Measure_Unit.name", source, where)
    if unit != "MWH":
        raise MalformedResponse(
            source, f"{where}.price_Measure_Unit.name", f"expected 'MWH', got {short(unit)}"
        )
    if currency == "EUR":
        return eur_to_usd
    if currency == "USD":
        return 1.0
    raise MalformedResponse(
        source, f"{where}.currency_Unit.name", f"expected 'EUR', got {short(currency)}"
    )


def _entsoe_window(period: ET.Element, source: str, pw: str) -> tuple[datetime, int, int]:
    """A Period's start, resolution in minutes and number of positions."""
    start = _eic_time(
        _text(period, "timeInterval/start", source, pw), source, f"{pw}.timeInterval.start"
    )
    end = _eic_time(_text(period, "timeInterval/end", source, pw), source, f"{pw}.timeInterval.end")
    res_text = _text(period, "resolution", source, pw)
    m = _RESOLUTION.match(res_text)
    if m is None or int(m.group(1)) <= 0:
        raise MalformedResponse(
            source, f"{pw}.resolution", f"expected PT<minutes>M, got {short(res_text)}"
        )
    minutes = int(m.group(1))
    n = int((end - start) / timedelta(minutes=minutes))
    if end <= start or n > _MAX_ENTSOE_POINTS:
        raise MalformedResponse(source, f"{pw}.timeInterval", "an empty or huge interval")
    return start, minutes, n


def _entsoe_points(period: ET.Element, n: int, source: str, pw: str) -> dict[int, float]:
    """A Period's prices by position (1..n), as given (positions may be left out)."""
    given: dict[int, float] = {}
    for q, point in enumerate(_children(period, "Point")):
        qw = f"{pw}.Point[{q}]"
        try:
            position = int(_text(point, "position", source, qw))
            amount = float(_text(point, "price.amount", source, qw))
        except ValueError:
            raise MalformedResponse(source, qw, "expected a position and a price number") from None
        if not 1 <= position <= n:
            raise MalformedResponse(source, f"{qw}.position", f"expected 1..{n}, got {position}")
        if not math.isfinite(amount):
            raise MalformedResponse(
                source, f"{qw}.price.amount", f"expected a finite price, got {amount}"
            )
        given[position] = amount
    return given


def parse_entsoe_prices(
    body: bytes | str, zone: str, *, eur_to_usd: float = EUR_TO_USD, source: str = "entsoe-prices"
) -> list[Obs]:
    """A Publication_MarketDocument of day-ahead prices -> USD/MWh per interval start.
    An Acknowledgement_MarketDocument (ENTSO-E's "no matching data") is an empty list."""
    root = _xml_root(body, source)
    kind = _local(root.tag)
    if kind == "Acknowledgement_MarketDocument":
        _entsoe_refused(root, source)
        return []
    if kind != "Publication_MarketDocument":
        raise MalformedResponse(
            source, "root", f"expected Publication_MarketDocument, got {short(kind)}"
        )
    # time -> (resolution minutes, value): where two series overlap the finer one wins.
    found: dict[datetime, tuple[int, float]] = {}
    for s, series in enumerate(_children(root, "TimeSeries")):
        where = f"TimeSeries[{s}]"
        rate = _entsoe_rate(series, eur_to_usd, source, where)
        for p, period in enumerate(_children(series, "Period")):
            pw = f"{where}.Period[{p}]"
            start, minutes, n = _entsoe_window(period, source, pw)
            given = _entsoe_points(period, n, source, pw)
            # Curve A03: a position left out repeats the one before it.
            last: float | None = None
            for position in range(1, n + 1):
                last = given.get(position, last)
                if last is None:
                    continue
                when = start + timedelta(minutes=minutes * (position - 1))
                prev = found.get(when)
                if prev is None or minutes < prev[0]:
                    found[when] = (minutes, last * rate)
    return [
        Obs(when, zone, value, "usd_per_mwh", when + timedelta(minutes=minutes), source)
        for when, (minutes, value) in sorted(found.items())
    ]


class Entsoe(KeyedSource):
    """ENTSO-E day-ahead prices per bidding zone (token as ``securityToken``, which the API
    wants in the query string: redacted from every log line and message)."""

    name: ClassVar[str] = "entsoe-prices"
    terms: ClassVar[str] = "ENTSO-E Transparency Platform terms (attribution)"
    kind: ClassVar[SignalKind] = SignalKind.POWER_PRICE
    history: ClassVar[bool] = True
    back: ClassVar[timedelta] = timedelta(hours=24)
    ahead: ClassVar[timedelta] = timedelta(hours=48)  # day-ahead: tomorrow is published
    what: ClassVar[str] = "day-ahead prices"  # in error messages: "<what> <zone>"

    default_url: ClassVar[str] = ENTSOE_DEFAULT_URL

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.eur_to_usd = float(ctx.options.get("eur_to_usd", EUR_TO_USD))

    def covers(self, key: str) -> bool:
        return key in ZONE_TO_EIC

    def _client(self, token: str) -> Any:
        entsoe = require(self.name, "entsoe", ENTSOE_EXTRA)
        return entsoe.EntsoeRawClient(
            api_key=token,
            session=_rebased_session(self.url, entsoe.entsoe.URL),
            retry_count=1,
            retry_delay=0,
            timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S),
        )

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        eic = ZONE_TO_EIC.get(key)
        if eic is None:
            raise MalformedResponse(self.name, "key", f"no ENTSO-E bidding zone for {key!r}")
        token = self.ctx.credential(self.name, ENTSOE_TOKEN_ENV)
        REDACTOR.add([token])  # entsoe-py sends it in the query string and logs its params
        client = self._client(token)
        no_data = require(self.name, "entsoe.exceptions", ENTSOE_EXTRA).NoMatchingDataError
        out: list[Obs] = []
        lo = start.replace(minute=0, second=0, microsecond=0)
        while lo < end:
            hi = min(lo + ENTSOE_CHUNK, end)

            def once(lo: datetime = lo, hi: datetime = hi) -> Any:
                try:
                    return self._query(client, eic, pd.Timestamp(lo), pd.Timestamp(hi))
                except no_data:  # "No matching data found" (reason 999): an empty answer
                    return None

            answer = call(
                self.name,
                f"{self.what} {key}",
                once,
                sleep=self.ctx.sleep,
                hint=f"check ${ENTSOE_TOKEN_ENV}",
            )
            if answer is not None:
                out.extend(self._parse(answer, key))
            lo = hi
        return out

    def _query(self, client: Any, eic: str, lo: pd.Timestamp, hi: pd.Timestamp) -> Any:
        """One chunk's answer from entsoe-py (`NoMatchingDataError` where there is none)."""
        return client.query_day_ahead_prices(eic, start=lo, end=hi)

    def _parse(self, answer: Any, key: str) -> list[Obs]:
        if not answer:
            return []
        return parse_entsoe_prices(answer, key, eur_to_usd=self.eur_to_usd, source=self.name)


def _rebased_session(base_url: str, library_url: str) -> Any:
    """A requests session that sends entsoe-py's requests (made to the module-level URL it
    read at import) to `base_url` instead (a mirror, a test server)."""
    import requests

    class Rebased(requests.Session):
        def request(
            self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any
        ) -> requests.Response:
            target = str(url)
            if target.rstrip("/") == library_url.rstrip("/"):
                target = base_url
            return super().request(method, target, *args, **kwargs)

    return Rebased()  # entsoe-py sets its own User-Agent on it


# -- ENTSO-E actual generation per production type -> average intensity ---------------------

# entsoe-py's production-type names (its PSRTYPE_MAPPINGS) -> life-cycle gCO2eq/kWh: the
# factors of `EMISSION_FACTORS` (IPCC AR5 medians) by fuel; lignite, coal-derived gas and peat
# as coal, oil shale as oil, marine as hydro, other renewable as biomass, waste and other as
# unknown. Storage (pumped hydro, batteries) moves energy and is left out.
ENTSOE_TYPE_FACTORS: Final[Mapping[str, float]] = {
    "Biomass": 230.0,
    "Fossil Brown coal/Lignite": 820.0,
    "Fossil Coal-derived gas": 820.0,
    "Fossil Gas": 490.0,
    "Fossil Hard coal": 820.0,
    "Fossil Oil": 650.0,
    "Fossil Oil shale": 650.0,
    "Fossil Peat": 820.0,
    "Geothermal": 38.0,
    "Hydro Run-of-river and pondage": 24.0,
    "Hydro Water Reservoir": 24.0,
    "Marine": 24.0,
    "Nuclear": 12.0,
    "Other renewable": 230.0,
    "Solar": 48.0,
    "Waste": 700.0,
    "Wind Offshore": 11.0,
    "Wind Onshore": 11.0,
    "Other": 700.0,
}
ENTSOE_STORAGE_TYPES: Final = frozenset({"Hydro Pumped Storage", "Energy storage"})
ENTSOE_GENERATION_LAG: Final = 2 * HOUR  # actual generation is published within ~1 h


def _generation_intervals(index: object, source: str) -> tuple[pd.DatetimeIndex, pd.Timedelta]:
    """The interval starts (UTC, distinct) of a generation frame and its step (<= 1 h)."""
    if not isinstance(index, pd.DatetimeIndex) or index.tz is None:
        raise MalformedResponse(source, "generation.index", "expected times with a UTC offset")
    index = index.tz_convert("UTC")
    if index.has_duplicates:
        raise MalformedResponse(source, "generation.index", "a repeated interval")
    steps = index.to_series().diff().dropna()
    step = steps.min() if len(steps) else pd.Timedelta(hours=1)
    if step <= pd.Timedelta(0) or step > pd.Timedelta(hours=1):
        raise MalformedResponse(source, "generation.index", f"an interval of {step}")
    return index, step


def entsoe_intensity(frame: object, zone: str, source: str = "entsoe-generation") -> list[Obs]:
    """entsoe-py's generation frame (``parse_generation(..., nett=True)``: one column per
    production type, MW, index = interval start) -> production-based average gCO2/kWh per
    interval, like `eia_intensity`: negative net output clipped to 0, storage and unknown
    types left out, NaN where nothing generated."""
    if not isinstance(frame, pd.DataFrame):
        raise MalformedResponse(
            source, "generation", f"expected a table, got {type(frame).__name__}"
        )
    if frame.empty:
        return []
    index, step = _generation_intervals(frame.index, source)
    total = np.zeros(len(frame))
    weighted = np.zeros(len(frame))
    for column in frame.columns:
        name = str(column)
        if name in ENTSOE_STORAGE_TYPES:
            continue
        factor = ENTSOE_TYPE_FACTORS.get(name)
        if factor is None:
            logger.debug("%s: production type %r has no emission factor; left out", source, name)
            continue
        mw = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        if np.isinf(mw).any():
            raise MalformedResponse(source, f"generation.{name}", "expected finite MW")
        mw = np.clip(np.nan_to_num(mw, nan=0.0), 0.0, None)
        total += mw
        weighted += mw * factor
    out = []
    for when, t, w in zip(index, total, weighted, strict=True):
        start = check_time(pd.Timestamp(when).to_pydatetime())
        value = float(w / t) if t > 0 else math.nan
        out.append(
            Obs(
                start,
                zone,
                value,
                "g_co2_per_kwh",
                start + step.to_pytimedelta() + ENTSOE_GENERATION_LAG,
                source,
            )
        )
    return out


class EntsoeGeneration(Entsoe):
    """ENTSO-E actual generation per production type (A75), through entsoe-py's client and
    parser, as a production-based average carbon intensity per bidding zone."""

    name: ClassVar[str] = "entsoe-generation"
    kind: ClassVar[SignalKind] = SignalKind.CARBON
    back: ClassVar[timedelta] = timedelta(hours=24)
    ahead: ClassVar[timedelta] = timedelta(0)
    what: ClassVar[str] = "generation"

    def _query(self, client: Any, eic: str, lo: pd.Timestamp, hi: pd.Timestamp) -> Any:
        text = client.query_generation(eic, start=lo, end=hi)
        parsers = require(self.name, "entsoe.parsers", ENTSOE_EXTRA)
        return parsers.parse_generation(text, nett=True)

    def _parse(self, answer: Any, key: str) -> list[Obs]:
        return entsoe_intensity(answer, key, self.name)


# -- EIA-930 ------------------------------------------------------------------------------

EIA_DEFAULT_URL: Final = "https://api.eia.gov/v2"
EIA_KEY_ENV: Final = "EIA_API_KEY"
EIA_PATH: Final = "/electricity/rto/fuel-type-data/data/"
EIA_PAGE: Final = 5000
EIA_MAX_PAGES: Final = 200
EIA_LAG: Final = 3 * HOUR  # EIA-930 hours arrive one to a few hours late
# Life-cycle emission factors, gCO2eq/kWh: IPCC AR5 WG3 Annex III, Table A.III.2 medians
# (coal 820, gas combined cycle 490, biomass 230, geothermal 38, hydro 24, nuclear 12,
# wind onshore 11, solar PV utility 48); oil 650 and unknown 700 are Electricity Maps'
# defaults for those modes. Storage (BAT, PS) moves energy and is left out.
EMISSION_FACTORS: Final[Mapping[str, float]] = {
    "COL": 820.0,
    "NG": 490.0,
    "OIL": 650.0,
    "NUC": 12.0,
    "WAT": 24.0,
    "SUN": 48.0,
    "SNB": 48.0,  # solar with integrated battery
    "WND": 11.0,
    "GEO": 38.0,
    "BIO": 230.0,
    "OTH": 700.0,
    "UNK": 700.0,
}
STORAGE_FUELS: Final = frozenset({"BAT", "PS", "OES"})
_EIA_PERIOD = re.compile(r"^(\d{4}-\d{2}-\d{2})T(\d{2})(?:([+-])(\d{2})(?::?(\d{2}))?)?$")


class EiaRow(Strict):
    period: str
    respondent: str
    fueltype: str
    value: float | None = None
    value_units: str | None = Field(default=None, alias="value-units")


class EiaBody(Strict):
    total: int = Field(ge=0)
    data: list[EiaRow]


class EiaResponse(Strict):
    response: EiaBody


def eia_period_utc(text: str, source: str = "eia930", where: str = "period") -> datetime:
    """``2024-03-10T08`` (frequency=hourly: UTC) or ``2024-03-10T01-08`` (local-hourly:
    local hour and its UTC offset, so both 01:00 hours of a fall-back night differ)."""
    m = _EIA_PERIOD.match(text.strip())
    if m is None:
        raise MalformedResponse(source, where, f"expected YYYY-MM-DDTHH, got {short(text)}")
    day, hour, sign, oh, om = m.groups()
    try:
        base = datetime.fromisoformat(f"{day}T{hour}:00:00")
    except ValueError:
        raise MalformedResponse(source, where, f"not a valid hour: {short(text)}") from None
    offset = timedelta(hours=int(oh or 0), minutes=int(om or 0))
    if sign is not None and offset > timedelta(hours=14):
        raise MalformedResponse(source, where, f"not a UTC offset: {short(text)}")
    when = base - offset if sign == "+" else base + offset
    try:
        return check_time(when.replace(tzinfo=UTC))
    except ValueError:
        raise MalformedResponse(source, where, f"out of range: {short(text)}") from None


def eia_page(body: bytes | str, source: str = "eia930") -> tuple[list[EiaRow], int]:
    resp = validate(EiaResponse, decode_json(body, source), source)
    for i, row in enumerate(resp.response.data):
        if row.value_units not in (None, "megawatthours"):
            raise MalformedResponse(
                source,
                f"response.data[{i}].value-units",
                f"expected 'megawatthours', got {short(row.value_units)}",
            )
    return resp.response.data, resp.response.total


def eia_intensity(rows: list[EiaRow], zone: str, source: str = "eia930") -> list[Obs]:
    """Per hour: sum(MWh x factor) / sum(MWh) over generating fuels (negative net generation
    clipped to 0, storage and unknown codes left out); NaN where nothing generated."""
    per_hour: dict[datetime, list[tuple[str, float]]] = {}
    for i, row in enumerate(rows):
        when = eia_period_utc(row.period, source, f"response.data[{i}].period")
        per_hour.setdefault(when, [])
        if row.value is None or row.fueltype in STORAGE_FUELS:
            continue
        if row.fueltype not in EMISSION_FACTORS:
            logger.debug("%s: fuel type %r has no emission factor; left out", source, row.fueltype)
            continue
        per_hour[when].append((row.fueltype, max(0.0, row.value)))
    out = []
    for when in sorted(per_hour):
        mix = per_hour[when]
        total = sum(v for _, v in mix)
        value = sum(v * EMISSION_FACTORS[f] for f, v in mix) / total if total > 0 else math.nan
        out.append(Obs(when, zone, value, "g_co2_per_kwh", when + HOUR + EIA_LAG, source))
    return out


def balancing_area(zone: str) -> str | None:
    """The EIA respondent code of an Electricity Maps US zone: its last part
    (US-CAL-CISO -> CISO, US-MIDA-PJM -> PJM)."""
    parts = zone.split("-")
    return parts[-1] if len(parts) >= 3 and parts[0] == "US" else None


class Eia930(KeyedSource):
    """EIA-930 hourly generation by fuel type per US balancing area (API key as
    ``api_key``, redacted), paginated by ``offset``/``length`` up to ``response.total``."""

    name: ClassVar[str] = "eia930"
    terms: ClassVar[str] = "public domain (U.S. EIA)"
    kind: ClassVar[SignalKind] = SignalKind.CARBON
    history: ClassVar[bool] = True
    back: ClassVar[timedelta] = timedelta(hours=24)

    default_url: ClassVar[str] = EIA_DEFAULT_URL

    def __init__(self, ctx: SourceContext) -> None:
        super().__init__(ctx)
        self.page_size = int(ctx.options.get("eia_page_size", EIA_PAGE))

    def covers(self, key: str) -> bool:
        return balancing_area(key) is not None

    def _read_key(self, key: str, start: datetime, end: datetime) -> list[Obs]:
        ba = balancing_area(key)
        if ba is None:
            raise MalformedResponse(self.name, "key", f"not a US balancing-area zone: {key!r}")
        api_key = self.ctx.credential(self.name, EIA_KEY_ENV)
        rows: list[EiaRow] = []
        offset = 0
        for _ in range(EIA_MAX_PAGES):
            params: dict[str, Any] = {
                "api_key": api_key,
                "frequency": "hourly",
                "data[0]": "value",
                "facets[respondent][]": ba,
                "start": start.strftime("%Y-%m-%dT%H"),
                "end": end.strftime("%Y-%m-%dT%H"),
                "sort[0][column]": "period",
                "sort[0][direction]": "asc",
                "offset": str(offset),
                "length": str(self.page_size),
            }
            body = self.ctx.http.get(
                self.name,
                f"{self.url}{EIA_PATH}",
                params=params,
                secrets=(api_key,),
                what=f"fuel-type-data {ba}",
                auth_hint=f"check ${EIA_KEY_ENV}",
            ).body
            page, total = eia_page(body, self.name)
            for i, row in enumerate(page):
                if row.respondent != ba:
                    raise MalformedResponse(
                        self.name,
                        f"response.data[{i}].respondent",
                        f"expected {ba!r}, got {short(row.respondent)}",
                    )
            rows.extend(page)
            offset += len(page)
            if offset >= total:
                break
            if not page:
                raise MalformedResponse(
                    self.name, "response.data", f"empty page at offset {offset} of {total}"
                )
        else:
            raise MalformedResponse(self.name, "response.total", f"more than {EIA_MAX_PAGES} pages")
        return eia_intensity(rows, key, self.name)


# -- CAISO curtailment --------------------------------------------------------------------

CAISO_LAG: Final = HOUR
# Column names of the report table (lower case, spaces as underscores) -> ours.
_CAISO_COLUMNS: Final[Mapping[str, str]] = {
    "report_date": "date",
    "date": "date",
    "hour_ending_pt": "he",
    "hour_ending": "he",
    "hour": "he",
    "he": "he",
    "curtailed_mwh": "mwh",
    "curtailment_mwh": "mwh",
    "curt_mwh": "mwh",
    "mwh": "mwh",
    "curtailed_mw": "mw",
    "curtailment_mw": "mw",
    "curt_mw": "mw",
    "mw": "mw",
    "fuel_type": "fuel",
    "fuel": "fuel",
}


def _number(text: str, source: str, where: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise MalformedResponse(source, where, f"expected a number, got {short(text)}") from None
    if not math.isfinite(value) or value < 0:
        raise MalformedResponse(source, where, f"expected a curtailment >= 0, got {text}")
    return value


def _caiso_columns(reader: Iterator[list[str]], source: str) -> list[str]:
    """The report's header row as our column names ('' for a column not used)."""
    try:
        header = next(reader)
    except StopIteration:
        raise MalformedResponse(source, "header", "an empty file") from None
    except csv.Error as exc:
        raise MalformedResponse(source, "header", f"not CSV ({exc})") from None
    names = [
        _CAISO_COLUMNS.get(re.sub(r"[^a-z0-9]+", "_", h.strip().lower()).strip("_"), "")
        for h in header
    ]
    for need in ("he", "mwh"):
        if need not in names:
            raise MalformedResponse(
                source, "header", f"expected a column for {need!r}, got {short(header)}"
            )
    return names


def _caiso_check_day(text: str, day: date, source: str, where: str) -> None:
    """A row's date (ISO or MM/DD/YYYY) must be the report's day."""
    try:
        row_day = date.fromisoformat(text.strip()[:10])
    except ValueError:
        try:
            row_day = datetime.strptime(text.strip(), "%m/%d/%Y").date()
        except ValueError:
            raise MalformedResponse(source, where, f"expected a date, got {short(text)}") from None
    if row_day != day:
        raise MalformedResponse(source, where, f"expected {day.isoformat()}, got {row_day}")


def parse_caiso_report(
    body: bytes | str, day: date, source: str = "caiso-curtailment"
) -> list[Obs]:
    """One report day as CSV -> curtailed MWh per hour (= average MW), every hour of the
    Pacific-time day (23, 24 or 25 of them), hours without a row 0. Hour ending h starts
    h-1 elapsed hours after local midnight (so HE 2 of the spring-forward day is 09:00 UTC
    and HE 25 exists only on the fall-back day)."""
    text = body.decode("utf-8-sig", errors="replace") if isinstance(body, bytes) else body
    reader = csv.reader(io.StringIO(text))
    names = _caiso_columns(reader, source)
    midnight = caiso_hour_start_utc(pd.Series([pd.Timestamp(day)]), pd.Series([1])).iloc[0]
    next_mid = caiso_hour_start_utc(
        pd.Series([pd.Timestamp(day + timedelta(days=1))]), pd.Series([1])
    ).iloc[0]
    n_hours = int((next_mid - midnight) / pd.Timedelta(hours=1))
    energy = [0.0] * n_hours
    try:
        for line_no, row in enumerate(reader, start=2):
            if not any(c.strip() for c in row):
                continue
            cells = dict(zip(names, row, strict=False))
            if "date" in cells and cells["date"].strip():
                _caiso_check_day(cells["date"], day, source, f"line {line_no}: date")
            he_value = _number(cells.get("he", ""), source, f"line {line_no}: hour ending")
            if he_value is None or he_value != int(he_value) or not 1 <= he_value <= n_hours:
                raise MalformedResponse(
                    source,
                    f"line {line_no}: hour ending",
                    f"expected 1..{n_hours} on {day}, got {short(cells.get('he'))}",
                )
            mwh = _number(cells.get("mwh", ""), source, f"line {line_no}: curtailed MWh")
            if mwh is None and "mw" in cells:
                mwh = _number(cells["mw"], source, f"line {line_no}: curtailed MW")
            energy[int(he_value) - 1] += mwh or 0.0
    except csv.Error as exc:
        raise MalformedResponse(source, "body", f"not CSV ({exc})") from None
    start = midnight.to_pydatetime()
    return [
        Obs(
            start + h * HOUR,
            CAISO_ZONE,
            energy[h],
            "mw",
            start + (h + 1) * HOUR + CAISO_LAG,
            source,
        )
        for h in range(n_hours)
    ]


__all__ = [
    "ENTSOE_TYPE_FACTORS",
    "ZONE_TO_EIC",
    "Eia930",
    "Entsoe",
    "EntsoeGeneration",
    "balancing_area",
    "eia_intensity",
    "eia_page",
    "entsoe_intensity",
    "parse_caiso_report",
    "parse_entsoe_prices",
]
