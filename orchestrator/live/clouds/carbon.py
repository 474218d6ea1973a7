"""Grid carbon of the cloud world's zones for `heliotrope offers`: `CarbonIndex` from a
trace, the state store's polled samples and the built-in scenario's yearly figures."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pandas as pd

from orchestrator.live.clouds.settings import CloudSettings
from orchestrator.model import SignalKind
from orchestrator.signals.grid import WORLD_AVG_G_PER_KWH
from orchestrator.signals.traces import DEFAULT_MAX_AGE_S, Trace, read_trace
from orchestrator.state import StateStore

HOURLY: Final = "carbon_avg_g_per_kwh"
YEARLY: Final = "carbon_avg_yearly_g_per_kwh"
CARBON_LOOKBACK_S: Final = 7 * 86400.0  # how far back the state store is asked for samples


@dataclass(frozen=True, slots=True)
class CarbonReading:
    g_per_kwh: float
    source: str  # says which: an hourly sample (when, from where), a yearly average, a default
    hourly: bool


@dataclass
class CarbonIndex:
    """Grid carbon intensity per grid zone: hourly samples (a trace's `grid.parquet`, the
    state store's `carbon` samples keyed by grid zone) and yearly averages (the trace's,
    else the built-in scenario's Electricity Maps 2024 figures), else the world average.

    `at(zone, now)` is the latest hourly value at or before `now` when there is one, else the
    yearly average, and says which. The controller's grid applies the trace's maximum ages
    (an hourly value older than 2 h no longer counts there)."""

    hourly: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    yearly: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    extra_rows: pd.DataFrame | None = None  # other grid metrics of a trace, passed through
    max_age_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MAX_AGE_S))

    @staticmethod
    def build(
        zones: Iterable[str],
        *,
        trace: Trace | None = None,
        store: StateStore | None = None,
        now_s: float | None = None,
    ) -> CarbonIndex:
        zones = sorted(set(zones))
        index = CarbonIndex()
        if trace is not None:
            index._add_trace(trace, zones)
        if store is not None and now_s is not None:
            index._add_store(store, zones, now_s)
        for series in index.hourly.values():
            series.sort(key=lambda x: x[0])
        index._add_scenario_yearly(zones)
        return index

    def _add_trace(self, trace: Trace, zones: list[str]) -> None:
        """The trace's hourly samples and latest yearly average of each zone, its maximum
        ages, and its other grid metrics (`extra_rows`)."""
        self.max_age_s = {**self.max_age_s, **{m: trace.max_age_s(m) for m in DEFAULT_MAX_AGE_S}}
        rows = trace.grid[trace.grid["grid_zone"].isin(zones)]
        for metric in (HOURLY, YEARLY):
            sel = rows[rows["metric"] == metric]
            for z, t, v, s in zip(
                sel["grid_zone"], sel["time"], sel["value"], sel["source"], strict=True
            ):
                if not math.isfinite(float(v)):
                    continue
                item = (pd.Timestamp(t).timestamp(), float(v), f"trace {s}".strip())
                if metric == HOURLY:
                    self.hourly.setdefault(str(z), []).append(item)
                elif str(z) not in self.yearly or item[0] >= self.yearly[str(z)][0]:
                    self.yearly[str(z)] = item
        self.extra_rows = rows[~rows["metric"].isin([HOURLY, YEARLY])]

    def _add_store(self, store: StateStore, zones: list[str], now_s: float) -> None:
        """The state store's polled carbon samples of the last `CARBON_LOOKBACK_S`."""
        for sample in store.samples(
            SignalKind.CARBON, zones, now_s - CARBON_LOOKBACK_S, now_s + 1.0
        ):
            if math.isfinite(sample.value):
                self.hourly.setdefault(sample.key, []).append(
                    (sample.time.timestamp(), float(sample.value), f"store {sample.source}")
                )

    def _add_scenario_yearly(self, zones: list[str]) -> None:
        """The built-in scenario's yearly figure for a zone with no yearly average yet."""
        from orchestrator.signals.scenario import GRID_ZONES

        for z in zones:
            if z not in self.yearly and z in GRID_ZONES:
                self.yearly[z] = (
                    float("nan"),
                    float(GRID_ZONES[z].yearly_g),
                    "scenario, Electricity Maps 2024",
                )

    def at(self, zone: str, now_s: float) -> CarbonReading:
        series = [x for x in self.hourly.get(zone, ()) if x[0] <= now_s]
        if series:
            t, value, source = series[-1]
            when = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")
            return CarbonReading(value, f"hourly {when} ({source})", True)
        if zone in self.yearly:
            t, value, source = self.yearly[zone]
            year = f" {datetime.fromtimestamp(t, UTC).year}" if math.isfinite(t) else ""
            return CarbonReading(value, f"yearly average{year} ({source})", False)
        return CarbonReading(WORLD_AVG_G_PER_KWH, "world average (no data for the zone)", False)


def carbon_sources(
    settings: CloudSettings, traces: Path | None
) -> tuple[Trace | None, StateStore | None]:
    """The trace (`--traces`, else the settings') and the state store (`db_url`, else
    $HELIOTROPE_DB_URL; no store is created just to read carbon) to read carbon from."""
    path = traces or settings.traces
    trace = read_trace(path) if path is not None else None
    url = settings.db_url or os.environ.get("HELIOTROPE_DB_URL")
    store: StateStore | None = None
    if url:
        from orchestrator.state import open_store

        store = open_store(url)
    return trace, store
