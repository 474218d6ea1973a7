"""Curtailment and wholesale power prices.

CAISO curtailment (``curtailment/caiso_wind_solar_curtailment_hourly_2016_2017.csv``) ->
``curtailment_mw`` for grid zone ``US-CAL-CISO``. The report's hour ending ``h`` (1-24, 25 on
the long day) is the h-th hour of the Pacific-time report day: it starts at local midnight
(America/Los_Angeles, via zoneinfo) plus ``h - 1`` elapsed hours, converted to UTC (so HE 1
of a summer day starts 07:00 UTC). The value is the curtailed energy of the hour summed over
curtailment types, reasons and fuels, in MWh per hour = average MW (where a row has no MWh
its "CURTAILED MW", the hour's maximum, stands in). Every hour of a report day without a row
is written as 0 (the report lists only hours with curtailment); days without a report are
left out (a gap).

Wholesale prices (``curtailment/wholesale_electricity_prices_hourly_usd_22zones_...``) ->
``power_price_usd_per_mwh``, negative prices kept. The file's zones are green-dcc folder names;
three differ from the Electricity Maps zone ids (see the zone list file
``carbon/electricitymaps_hourly_ci_16zones_zone_list.csv``): DE-LU -> DE, BR-SP -> BR-CS,
CL-SIC -> CL-SEN. AU-NSW and AU-VIC are AEMO prices in AUD that green-dcc labelled USD and
did not convert; they are converted here with green-dcc's own AUD rate.

GB is missing from that file; its day-ahead prices in EUR come from the local-currency file
(RTE eco2mix, timestamps in French local time, Europe/Paris), converted at green-dcc's fixed
EUR rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
import pandas as pd

from orchestrator.errors import InputError
from orchestrator.signals.importers._common import (
    HOUR_NS,
    Loaded,
    Part,
    SourceFile,
    grid_values,
    importer,
    table,
    to_number,
)

CAISO: Final = Path("curtailment/caiso_wind_solar_curtailment_hourly_2016_2017.csv")
WHOLESALE_USD: Final = Path(
    "curtailment/wholesale_electricity_prices_hourly_usd_22zones_2020_2024.csv.gz"
)
WHOLESALE_LOCAL: Final = Path(
    "curtailment/wholesale_electricity_prices_hourly_local_currency_as_published.csv.gz"
)

ZONE_LIST: Final = Path("carbon/electricitymaps_hourly_ci_16zones_zone_list.csv")

CAISO_ZONE: Final = "US-CAL-CISO"
PACIFIC: Final = ZoneInfo("America/Los_Angeles")
ECO2MIX_TZ: Final = ZoneInfo("Europe/Paris")

# green-dcc price folder -> Electricity Maps zone id, where they differ (zone list file).
PRICE_ZONE_TO_GRID_ZONE: Final = {
    "DE-LU": "DE",  # the DE-LU bidding zone; Electricity Maps zone DE (Germany)
    "BR-SP": "BR-CS",  # Sao Paulo: Brazil's Southeast/Central-West subsystem, EM BR-CS
    "CL-SIC": "CL-SEN",  # the old SIC system, merged into Chile's SEN in 2017
}
# green-dcc standardize_prices_to_utc_usd.py, "extracted from oanda.com on 2025-03-27".
EUR_TO_USD: Final = 1.07764
AUD_TO_USD: Final = 0.63056
_AUD_ZONES: Final = ("AU-NSW", "AU-VIC")
_GREEN_DCC_LICENSE: Final = (
    "repo MIT; the underlying exchange and ISO data keep their own terms (research use)"
)
_CAISO: Final = SourceFile(
    CAISO,
    "caiso_wind_solar_curtailment_hourly",
    "MIT (scraper repo); CAISO public data",
    "ahrensdaniel/caiso-curtailment-scraper ctmtcsv/ @06e7b52",
    ("report_date", "hour_ending_pt", "curtailed_mwh"),
    optional=("curtailed_mw",),
)
_ZONE_LIST: Final = SourceFile(
    ZONE_LIST,
    "electricitymaps_hourly_ci_16zones_zone_list",
    "ODbL zone ids (Electricity Maps); folder names from HewlettPackard/green-dcc (MIT)",
    "HewlettPackard/green-dcc data/carbon_intensity folder names @3f6ea95",
    ("zone_id", "green_dcc_folder"),
)
_WHOLESALE_USD: Final = SourceFile(
    WHOLESALE_USD,
    "wholesale_electricity_prices_hourly_usd",
    _GREEN_DCC_LICENSE,
    "HewlettPackard/green-dcc data/electricity_prices/standardized @3f6ea95",
    ("datetime_utc", "zone", "price_usd_per_mwh"),
)
_WHOLESALE_LOCAL: Final = SourceFile(
    WHOLESALE_LOCAL,
    "wholesale_electricity_prices_hourly_local_currency",
    _GREEN_DCC_LICENSE,
    "HewlettPackard/green-dcc electricity_prices/processed + scripts/GB @3f6ea95",
    ("datetime_as_published", "zone", "currency", "price_per_mwh_local_currency"),
)


def _ns(series: pd.Series) -> npt.NDArray[np.int64]:
    return np.asarray(series.dt.as_unit("ns").astype("int64").to_numpy(), dtype=np.int64)


def caiso_hour_start_utc(report_date: pd.Series, hour_ending: pd.Series) -> pd.Series:
    """UTC start of hour-ending `hour_ending` (1-based) on the Pacific-time `report_date`."""
    midnight = pd.to_datetime(report_date).dt.tz_localize(PACIFIC).dt.tz_convert("UTC")
    return midnight + pd.to_timedelta(hour_ending - 1, unit="h")


def _report_hours(day: pd.Series) -> tuple[pd.Series, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The distinct report days of `day`, the UTC start (ns) of every hour of them (local
    midnight to the next: 23, 24 or 25 hours) and the UTC end (ns) of each day."""
    days = pd.Series(np.unique(day.to_numpy()))
    hour_one = pd.Series(1, index=days.index)
    first_ns = _ns(caiso_hour_start_utc(days, hour_one))
    after_ns = _ns(caiso_hour_start_utc(days + pd.Timedelta(days=1), hour_one))
    n_hours = (after_ns - first_ns) // HOUR_NS
    offsets = np.arange(n_hours.sum()) - np.repeat(np.cumsum(n_hours) - n_hours, n_hours)
    hours_ns = np.repeat(first_ns, n_hours) + offsets * HOUR_NS
    return days, hours_ns, after_ns


@importer("caiso_curtailment", _CAISO)
def import_caiso_curtailment(part: Part, data_dir: Path, f: Loaded) -> None:
    day = f.utc("report_date", "%Y-%m-%d").dt.tz_localize(None)
    he = f.number("hour_ending_pt", allow_missing=False)
    bad = (he < 1) | (he > 25) | (he != np.floor(he))
    if bool(bad.any()):
        pos = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            str(f.path),
            f"line {pos + 2}, column 'hour_ending_pt'",
            "an hour ending 1..25",
            got=repr(f.raw["hour_ending_pt"].iloc[pos]),
        )
    mwh = f.number("curtailed_mwh")
    mw = f.number("curtailed_mw") if "curtailed_mw" in f.raw.columns else mwh * np.nan
    energy = mwh.fillna(mw)
    n_mw, n_none = int((mwh.isna() & mw.notna()).sum()), int(energy.isna().sum())

    start_ns = _ns(caiso_hour_start_utc(day, he))
    days, hours_ns, after_ns = _report_hours(day)
    day_pos = np.searchsorted(days.to_numpy(), day.to_numpy())
    outside = start_ns >= after_ns[day_pos]
    if outside.any():
        part.notes.append(
            f"CAISO: {int(outside.sum())} rows with an hour ending beyond the "
            "length of their report day skipped."
        )
    summed = energy[~outside].fillna(0.0).groupby(start_ns[~outside]).sum()
    values = summed.reindex(hours_ns, fill_value=0.0).to_numpy()
    hours = pd.to_datetime(hours_ns, utc=True)
    part.grid = table(
        "grid",
        time=hours,
        grid_zone=CAISO_ZONE,
        metric="curtailment_mw",
        value=values,
        source="caiso",
    )
    part.notes.append(
        "CAISO curtailment: hour ending h of the Pacific-time report day starts h-1 hours after "
        "local midnight (America/Los_Angeles), converted to UTC; value = curtailed MWh of the "
        "hour summed over types and fuels (= average MW); hours of report days without a row "
        f"are 0, days without a report are a gap. {n_mw} rows without MWh used their hourly "
        f"maximum MW instead; {n_none} rows with neither counted as 0."
    )


def _zone_mapping(data_dir: Path, part: Part) -> dict[str, str]:
    """green-dcc folder -> Electricity Maps zone id from the zone list file where present
    (it must agree with `PRICE_ZONE_TO_GRID_ZONE`), else the built-in table."""
    mapping = dict(PRICE_ZONE_TO_GRID_ZONE)
    if not (data_dir / ZONE_LIST).is_file():
        part.notes.append(f"{ZONE_LIST} missing: the built-in price zone mapping is used.")
        return mapping
    f = _ZONE_LIST.read(data_dir)
    listed = {
        d: z for d, z in zip(f.text("green_dcc_folder"), f.text("zone_id"), strict=True) if d != z
    }
    for folder, zone in listed.items():
        if mapping.get(folder, zone) != zone:
            raise InputError(
                str(f.path),
                "column 'zone_id'",
                f"{mapping[folder]!r} for green_dcc_folder {folder!r}",
                got=repr(zone),
            )
        mapping[folder] = zone
    part.cite(data_dir, f)
    return mapping


@importer("wholesale_prices_usd", _WHOLESALE_USD)
def import_wholesale_usd(part: Part, data_dir: Path, f: Loaded) -> None:
    zone = f.text("zone")
    value = f.number("price_usd_per_mwh")
    aud = zone.isin(_AUD_ZONES)
    value = value.where(~aud, value * AUD_TO_USD)
    grid_zone = zone.replace(_zone_mapping(data_dir, part))
    time = f.utc("datetime_utc")
    part.grid, _ = grid_values(time, grid_zone, "power_price_usd_per_mwh", value, "green-dcc")
    part.notes.append(
        "Wholesale prices (green-dcc, converted by its authors at fixed 2025-03-27 rates, "
        "smoothed with a 2-hour rolling mean and gap-interpolated): zones mapped to Electricity "
        "Maps ids DE-LU -> DE, BR-SP -> BR-CS, CL-SIC -> CL-SEN (zone list file), others "
        f"unchanged; AU-NSW and AU-VIC are AUD labelled USD, converted at {AUD_TO_USD} USD/AUD "
        "(green-dcc's rate); negative prices kept."
    )


@importer("wholesale_prices_gb", _WHOLESALE_LOCAL)
def import_gb_prices(part: Part, data_dir: Path, f: Loaded) -> None:
    path, raw = f.path, f.raw
    gb = raw[raw["zone"] == "GB"].reset_index(drop=True)
    currencies = set(gb["currency"].dropna().astype("str"))
    if currencies - {"EUR"}:
        raise InputError(
            str(path), "column 'currency'", "EUR for zone GB", got=", ".join(sorted(currencies))
        )
    local = pd.to_datetime(gb["datetime_as_published"], format="%Y-%m-%d %H:%M:%S", errors="coerce")
    if bool(local.isna().any()):
        pos = int(np.flatnonzero(local.isna().to_numpy())[0])
        raise InputError(
            str(path),
            "column 'datetime_as_published'",
            "a local time YYYY-MM-DD HH:MM:SS for zone GB",
            got=repr(gb["datetime_as_published"].iloc[pos]),
        )
    time = local.dt.tz_localize(ECO2MIX_TZ, ambiguous="NaT", nonexistent="NaT")
    value = to_number(path, gb, "price_per_mwh_local_currency") * EUR_TO_USD
    keep = (time.notna() & value.notna()).to_numpy()
    frame = table(
        "grid",
        time=time[keep].dt.tz_convert("UTC"),
        grid_zone="GB",
        metric="power_price_usd_per_mwh",
        value=value[keep],
        source="green-dcc-gb-eur",
    )
    part.grid = frame.drop_duplicates(["time"], keep="first").reset_index(drop=True)
    part.notes.append(
        "GB wholesale prices: the local-currency file's GB rows (EUR, RTE eco2mix day-ahead; "
        "timestamps read as French local time, Europe/Paris, the publisher's clock: +-1 h "
        f"uncertain) converted at a fixed {EUR_TO_USD} USD/EUR (green-dcc's rate); "
        f"{int((~keep).sum())} rows at DST-ambiguous or missing local times skipped; the "
        "'GB_incompleted' rows are ignored. Not smoothed, unlike the USD file."
    )
