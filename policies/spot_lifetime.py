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

# Rows of `LifetimeTracker._sums`: uptime, ends, downtime, returns, young ends, uptime past
# youth.
_NUMERATORS = np.array([2, 4, 0])  # downtime, young ends, uptime
_DENOMINATORS = np.array([3, 3, 1])  # returns, returns, ends


def _sums(
    available: FloatArray, tick_h: float, halflife_h: float
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, BoolArray]:
    """Weighted uptime hours, ends of runs, downtime hours, returns (ends of outages), and
    whether each offer is up now."""
    up = np.greater(available, 0)  # NaN (unknown) counts as down
    n = up.shape[0]
    age_h = (n - 1 - np.arange(n)) * tick_h
    weight = 0.5 ** (age_h / halflife_h) if halflife_h > 0 else np.ones(n)
    uptime_h = weight @ up * tick_h
    downtime_h = weight @ ~up * tick_h
    if n > 1:
        ends = weight[1:] @ (up[:-1] & ~up[1:])
        returns = weight[1:] @ (~up[:-1] & up[1:])
    else:
        ends = returns = np.zeros(up.shape[1])
    return uptime_h, ends, downtime_h, returns, up[-1]


def expected_lifetime_h(
    available: FloatArray,
    tick_h: float,
    *,
    prior_hours: float = 6.0,
    halflife_h: float = 12.0,
) -> FloatArray:
    """`available` is [time, offer] (capacity; > 0 available, 0 not, NaN unknown), newest
    row last; returns the expected remaining availability in hours per offer."""
    uptime_h, ends, _, _, _ = _sums(available, tick_h, halflife_h)
    result: FloatArray = (uptime_h + prior_hours) / (ends + 1.0)
    return result


@dataclass
class LifetimeTracker:
    """`expected_lifetime_h` tick after tick. Call with the history view of each tick (an
    object with ``spot_capacity(lookback)`` and, to carry state over, ``grid`` and ``tick``);
    the state moves on only from the tick before to this one of the same grid, else it is
    rebuilt from the last `lookback` rows by the same steps.

    After each call, per offer:
    - `outage_h`: the expected length of an outage, the same estimate for the runs of
      unavailability (a prior of one outage of `outage_prior_h`): how long a job that waits
      for an offer that is down now should expect to wait;
    - `age_h`: how long the offer has been available (0: down);
    - `young_death`: the share of its runs that ended within `young_h` of starting (a prior
      of one run in two): spot capacity flickers, so a run that has just begun is likely
      to end at once, and one that has lasted is likely to last (a decreasing hazard);
    - `mature_h` (computed when read): the expected lifetime of a run past its youth, the
      same estimate over the runs' uptime after `young_h` and the ends of the runs that
      outlived it (the same prior): how long a launch that does not die young stays.
    """

    tick_h: float
    prior_hours: float
    halflife_h: float
    lookback: int
    outage_prior_h: float = 1.0
    young_h: float = 0.5
    outage_h: FloatArray = field(default_factory=lambda: np.zeros(0), repr=False)
    age_h: FloatArray = field(default_factory=lambda: np.zeros(0), repr=False)
    young_death: FloatArray = field(default_factory=lambda: np.zeros(0), repr=False)
    _grid: Any = field(default=None, repr=False)
    _tick: int = -1
    _sums: FloatArray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    _up: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)
    _age: FloatArray = field(default_factory=lambda: np.zeros(0), repr=False)
    _priors: tuple[tuple[float, float], FloatArray] | None = field(default=None, repr=False)
    _columns: tuple[tuple[float, float], FloatArray, int] | None = field(default=None, repr=False)

    def __call__(self, history: Any) -> FloatArray:
        grid, tick = getattr(history, "grid", None), getattr(history, "tick", None)
        if grid is not None and grid is self._grid and tick == self._tick:
            pass  # the same tick again
        elif grid is not None and grid is self._grid and tick == self._tick + 1:
            self._step(np.greater(history.spot_capacity(1)[-1], 0))
        else:
            rows = np.greater(history.spot_capacity(self.lookback), 0)
            self._sums = np.zeros((6, rows.shape[1]))
            self._up = rows[0]
            self._age = np.zeros(rows.shape[1])
            for row in rows:
                self._step(row)
        self._grid, self._tick = grid, (tick if tick is not None else -1)
        # (downtime + outage prior, young ends + 0.5, uptime + prior) over (returns + 1,
        # returns + 1, ends + 1): outage_h, young_death, lifetime
        key = (self.outage_prior_h, self.prior_hours)
        if self._priors is None or self._priors[0] != key:
            self._priors = (key, np.array([[self.outage_prior_h], [0.5], [self.prior_hours]]))
        priors = self._priors[1]
        ratio = (self._sums[_NUMERATORS] + priors) / (self._sums[_DENOMINATORS] + 1.0)
        self.outage_h, self.young_death = ratio[0], ratio[1]
        self.age_h = self._age * self.tick_h
        result: FloatArray = ratio[2]
        return result

    @property
    def mature_h(self) -> FloatArray:
        """(uptime past youth + prior) / (ends - young ends + 1), as of the last call."""
        result: FloatArray = (self._sums[5] + self.prior_hours) / (
            self._sums[1] - self._sums[4] + 1.0
        )
        return result

    def _step(self, now: BoolArray) -> None:
        """Weighted sums move on by one row (`now`: available per offer).

        Each offer adds one of a few fixed columns (uptime, end, downtime, return, young
        end, uptime past youth), chosen by (up before, up now, young before): one table
        look-up."""
        decay = 0.5 ** (self.tick_h / self.halflife_h) if self.halflife_h > 0 else 1.0
        table, young_age = self._table()
        # A run younger than `young_h` (age * tick_h <= young_h + 1e-9) is one of at most
        # `young_age` ticks; wherever an offer was up its age is >= 1, so with
        # `young_age` 0 no end is young. Age 0 while up is the first row's (its run's
        # start unknown): young, so its tick is not counted past youth.
        young = (self._age <= young_age).view(np.int8)
        self._sums *= decay
        self._sums += table[:, self._up.view(np.int8), now.view(np.int8), young]
        age = self._age + 1.0
        age *= now  # 0 where down
        self._age = age
        self._up = now

    def _table(self) -> tuple[FloatArray, int]:
        """[sum, up before, up now, young before] -> what the step adds; and the oldest age
        (in ticks) that is young."""
        key = (self.tick_h, self.young_h)
        if self._columns is None or self._columns[0] != key:
            t = self.tick_h
            table = np.zeros((6, 2, 2, 2))
            table[:, 0, 0] = np.array([0.0, 0.0, t, 0.0, 0.0, 0.0])[:, None]  # still down
            table[:, 0, 1] = np.array([t, 0.0, 0.0, 1.0, 0.0, 0.0])[:, None]  # back
            table[:, 1, 0, 0] = [0.0, 1.0, t, 0.0, 0.0, 0.0]  # a run ends
            table[:, 1, 0, 1] = [0.0, 1.0, t, 0.0, 1.0, 0.0]  # a young run ends
            table[:, 1, 1] = np.array([t, 0.0, 0.0, 0.0, 0.0, 0.0])[:, None]  # still up
            table[5, 1, 1, 0] = t  # still up, past its youth
            young_age = -1
            while (young_age + 1) * self.tick_h <= self.young_h + 1e-9:
                young_age += 1
                if young_age > 1_000_000:
                    break
            self._columns = (key, table, young_age)
        return self._columns[1], self._columns[2]
