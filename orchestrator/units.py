"""Unit conversions. Names carry their unit; these helpers are the only place units change.

They work on floats and on numpy arrays alike (elementwise), so the vectorized cost model
(`orchestrator.costs`) and the scalar code paths share one definition of each conversion.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

SECONDS_PER_HOUR = 3600.0
G_PER_KG = 1000.0
KG_PER_TONNE = 1000.0
G_PER_TONNE = G_PER_KG * KG_PER_TONNE
LBS_PER_KG = 2.2046226218
BITS_PER_BYTE = 8.0
TICK_TOLERANCE_S = 1e-6  # a time this close below a tick boundary belongs to the next tick

# A float, or an array of them: every conversion maps elementwise.
Num = TypeVar("Num", float, npt.NDArray[np.float64])


def hours(seconds: Num) -> Num:
    return seconds / SECONDS_PER_HOUR


def seconds(hours_: Num) -> Num:
    return hours_ * SECONDS_PER_HOUR


def kwh(power_kw: float, pue: float, duration_h: float) -> float:
    """Facility energy: IT power times PUE times duration."""
    return power_kw * pue * duration_h


def kg_co2(energy_kwh: Num, g_co2_per_kwh: Num | float) -> Num:
    return energy_kwh * g_co2_per_kwh / G_PER_KG


def g_per_kwh_from_lbs_per_mwh(lbs_per_mwh: float) -> float:
    """WattTime reports lbs CO2 per MWh; 1 lb/MWh = 0.4536 g/kWh."""
    return lbs_per_mwh / LBS_PER_KG


def tick_at(t_s: float, start_s: float, tick_s: float) -> int:
    """Index of the tick in force at `t_s` on a grid of ticks ``start_s + k * tick_s``
    (unclipped; negative before the start). A time within `TICK_TOLERANCE_S` below a
    boundary counts as that boundary, so float rounding of a tick's own time never moves it
    back one tick."""
    return int((t_s - start_s + TICK_TOLERANCE_S) // tick_s)
