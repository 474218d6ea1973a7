"""A policy's view of the past: signal rows up to and including the current tick, never after.

Forecasts and spot-lifetime estimates read history through this view, so a decision at
tick k is a function of rows 0..k only (tests replace later rows with garbage to prove it).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.model import FloatArray
from orchestrator.signals.grid import SignalGrid


@dataclass(frozen=True, slots=True)
class SignalHistory:
    grid: SignalGrid
    tick: int  # index of "now" in the grid

    def _rows(self, matrix: FloatArray, lookback: int) -> FloatArray:
        lo = max(0, self.tick + 1 - lookback)
        view = matrix[lo : self.tick + 1]
        view.setflags(write=False)
        return view

    def usd_per_hour(self, lookback: int) -> FloatArray:
        return self._rows(self.grid.usd_per_hour, lookback)

    def spot_capacity(self, lookback: int) -> FloatArray:
        return self._rows(self.grid.spot_capacity, lookback)

    def carbon_g_per_kwh(self, lookback: int) -> FloatArray:
        return self._rows(self.grid.carbon_g_per_kwh, lookback)

    def carbon_marginal_g_per_kwh(self, lookback: int) -> FloatArray:
        return self._rows(self.grid.carbon_marginal_g_per_kwh, lookback)

    def curtailing(self, lookback: int) -> FloatArray:
        rows = self._rows(self.grid.curtailing.astype(float), lookback)
        return rows
