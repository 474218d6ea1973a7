"""Unit conversions. Names carry their unit; these helpers are the only place units change."""

from __future__ import annotations

SECONDS_PER_HOUR = 3600.0
LBS_PER_KG = 2.2046226218


def hours(seconds: float) -> float:
    return seconds / SECONDS_PER_HOUR


def seconds(hours_: float) -> float:
    return hours_ * SECONDS_PER_HOUR


def kwh(power_kw: float, pue: float, duration_h: float) -> float:
    """Facility energy: IT power times PUE times duration."""
    return power_kw * pue * duration_h


def kg_co2(energy_kwh: float, g_co2_per_kwh: float) -> float:
    return energy_kwh * g_co2_per_kwh / 1000.0


def g_per_kwh_from_lbs_per_mwh(lbs_per_mwh: float) -> float:
    """WattTime reports lbs CO2 per MWh; 1 lb/MWh = 0.4536 g/kWh."""
    return lbs_per_mwh / LBS_PER_KG


def usd_per_kwh_from_usd_per_mwh(usd_per_mwh: float) -> float:
    return usd_per_mwh / 1000.0
