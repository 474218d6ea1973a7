"""How long a spot offer that is available now is expected to stay available.

Estimated from the offer's own availability history up to now (never after): uptime runs
are survival data, completed runs are events and the current run is censored. Under a
constant hazard the maximum-likelihood rate is ``events / total uptime`` (the exponential
special case of Kaplan-Meier; it needs no per-run bookkeeping and vectorizes over offers).
Recent history counts more: each tick is weighted by ``0.5 ** (age / halflife)``, so a zone
that has been flickering for the last hours is expected to flicker on, whatever it did last
week. A prior of one run of `prior_hours` keeps offers with little history sensible.

`expected_lifetime_h` computes it from a block of rows; `LifetimeTracker` carries the two
weighted sums from one tick to the next (one row of work per tick instead of a week of
rows), and falls back to the block when it cannot (first call, another history, a skipped
tick). The two agree to the weight of the rows the block leaves out (0.5 ** (lookback /
halflife): 2**-28 for a week at a 6 h half-life).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.model import BoolArray, FloatArray


def _sums(available: FloatArray, tick_h: float, halflife_h: float
          ) -> tuple[FloatArray, FloatArray, BoolArray]:
    """Weighted uptime hours, weighted ends of runs, and whether each offer is up now."""
    up = np.greater(available, 0)  # NaN (unknown) counts as down
    n = up.shape[0]
    age_h = (n - 1 - np.arange(n)) * tick_h
    weight = 0.5 ** (age_h / halflife_h) if halflife_h > 0 else np.ones(n)
    uptime_h = weight @ up * tick_h
    ends = weight[1:] @ (up[:-1] & ~up[1:]) if n > 1 else np.zeros(up.shape[1])
    return uptime_h, ends, up[-1]


def expected_lifetime_h(
    available: FloatArray,
    tick_h: float,
    *,
    prior_hours: float = 6.0,
    halflife_h: float = 12.0,
) -> FloatArray:
    """`available` is [time, offer] (capacity; > 0 available, 0 not, NaN unknown), newest
    row last; returns the expected remaining availability in hours per offer."""
    uptime_h, ends, _ = _sums(available, tick_h, halflife_h)
    result: FloatArray = (uptime_h + prior_hours) / (ends + 1.0)
    return result


@dataclass
class LifetimeTracker:
    """`expected_lifetime_h` tick after tick. Call with the history view of each tick (an
    object with ``spot_capacity(lookback)`` and, to carry state over, ``grid`` and ``tick``);
    the state moves on only from the tick before to this one of the same grid."""

    tick_h: float
    prior_hours: float
    halflife_h: float
    lookback: int
    _grid: Any = field(default=None, repr=False)
    _tick: int = -1
    _uptime: FloatArray = field(default_factory=lambda: np.zeros(0), repr=False)
    _ends: FloatArray = field(default_factory=lambda: np.zeros(0), repr=False)
    _up: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)

    def __call__(self, history: Any) -> FloatArray:
        grid, tick = getattr(history, "grid", None), getattr(history, "tick", None)
        if grid is not None and grid is self._grid and tick == self._tick:
            pass  # the same tick again
        elif grid is not None and grid is self._grid and tick == self._tick + 1:
            now = np.greater(history.spot_capacity(1)[-1], 0)
            decay = 0.5 ** (self.tick_h / self.halflife_h) if self.halflife_h > 0 else 1.0
            self._uptime = self._uptime * decay + now * self.tick_h
            self._ends = self._ends * decay + (self._up & ~now)
            self._up = now
        else:
            self._uptime, self._ends, self._up = _sums(
                history.spot_capacity(self.lookback), self.tick_h, self.halflife_h)
        self._grid, self._tick = grid, (tick if tick is not None else -1)
        result: FloatArray = (self._uptime + self.prior_hours) / (self._ends + 1.0)
        return result
