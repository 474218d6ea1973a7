"""How long a spot offer that is available now is expected to stay available.

Estimated from the offer's own availability history up to now (never after): uptime runs
are survival data, completed runs are events and the current run is censored. Under a
constant hazard the maximum-likelihood rate is ``events / total uptime`` (the exponential
special case of Kaplan-Meier; it needs no per-run bookkeeping and vectorizes over offers).
Recent history counts more: each tick is weighted by ``0.5 ** (age / halflife)``, so a zone
that has been flickering for the last hours is expected to flicker on, whatever it did last
week. A prior of one run of `prior_hours` keeps offers with little history sensible.

How long an outage under way will last yet, at given odds, is read from the outages
themselves instead (`outage_rest_quantile`): outages are heavy-tailed, which no single
rate describes (over the whole SkyNomad H100 trace, 13 zones at 10-minute ticks, more than
half of all outages last one tick, while of those that last twelve ticks, half go on for
42 more or longer).

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

from orchestrator.model import BoolArray, FloatArray, IntArray

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

    And, when asked: `outages()`, every outage of the last `lookback` rows (its offer, its
    length, whether it has ended), and `down_rows(offer)`, how long the offer's outage
    under way has lasted: what `outage_rest_quantile` reads for the odds that an outage ends
    in time; `longest_outage_bound()`, a cheap bound on the longest of those outages.
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
    # Outages that ended (offer, first down row, length in rows): the latest as a list,
    # the rest as columns of `_done`, in the order they ended; per offer, the first down row
    # of the outage under way (-1: up, or down since before the rows seen). Rows count from
    # the first row seen (`_rows`).
    _outages: list[tuple[int, int, int]] = field(default_factory=list, repr=False)
    _done: IntArray = field(default_factory=lambda: np.zeros((3, 0), dtype=np.int64), repr=False)
    _down_since: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False)
    _rows: int = 0
    _columns: tuple[tuple[float, float], FloatArray, int] | None = field(default=None, repr=False)
    # (`_rows` when `outages()` last ran, the longest it listed); -1: not since the rebuild
    _longest: tuple[int, int] = field(default=(-1, 0), repr=False)

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
            self._outages, self._rows = [], 0
            self._done = np.zeros((3, 0), dtype=np.int64)
            self._down_since = np.full(rows.shape[1], -1, dtype=np.int64)
            self._longest = (-1, 0)
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

    def outages(self) -> tuple[IntArray, IntArray, BoolArray]:
        """The outages of the last `lookback` rows, as of the last call: offer, length in
        rows, and whether each has ended (else it goes on, its length so far). Outages that
        began before those rows are left out (as when the tracker was rebuilt from them,
        where their start is unknown)."""
        first = max(self._rows - self.lookback + 1, 0)  # the oldest row that can start one
        if self._outages:  # ended since the last look
            self._done = np.concatenate([self._done, np.array(self._outages).T], axis=1)
            self._outages = []
        gone = self._done[1] < first  # begun before the window (kept in order of ending)
        if gone.any():
            self._done = self._done[:, ~gone]
        going = np.flatnonzero(self._down_since >= first)
        offer = np.concatenate([self._done[0], going])
        length = np.concatenate([self._done[2], self._rows - self._down_since[going]])
        ended = np.arange(offer.size) < self._done.shape[1]
        self._longest = (self._rows, int(length.max(initial=0)))
        return offer, length, ended

    def longest_outage_bound(self) -> int:
        """At least the length (in rows) of the longest outage `outages()` would list now,
        without listing them: a step adds at most a row to any outage, so the longest of
        the last listing plus the steps since (exact where it was listed at this step)."""
        rows, longest = self._longest
        if rows < 0:
            self.outages()
            rows, longest = self._longest
        return longest + self._rows - rows

    def down_rows(self, offer: int) -> int:
        """How many rows offer `offer` has been down, as of the last call (0: up), up to
        `lookback`: what the last `lookback` rows show, stepped or rebuilt alike (down since
        before the rows seen: all of them)."""
        if self._up[offer]:
            return 0
        since = int(self._down_since[offer])
        return min(self._rows - since if since >= 0 else self._rows, self.lookback)

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
        case = (self._age <= young_age).view(np.int8)  # column: up before, up now, young
        case = case + 4 * self._up.view(np.int8) + 2 * now.view(np.int8)
        self._sums *= decay
        self._sums += table[:, case]
        age = self._age + 1.0
        age *= now  # 0 where down
        self._age = age
        went, back = self._up & ~now, ~self._up & now
        if back.any():  # outages that end (their length known only if their start is)
            for o in np.flatnonzero(back & (self._down_since >= 0)).tolist():
                start = int(self._down_since[o])
                self._outages.append((o, start, self._rows - start))
            self._down_since[back] = -1
        self._down_since[went] = self._rows
        self._rows += 1
        self._up = now

    def _table(self) -> tuple[FloatArray, int]:
        """[sum, 4 up before + 2 up now + young before] -> what the step adds; and the oldest
        age (in ticks) that is young."""
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
            self._columns = (key, table.reshape(6, 8), young_age)
        return self._columns[1], self._columns[2]


def outage_rest_quantile(
    outages: tuple[IntArray, IntArray, BoolArray], offer: int, age: int, odds: float, pool: float
) -> float:
    """How long (in rows) offer `offer`'s outage, `age` rows old, will last yet, at `odds`:
    the `odds` quantile of the rest of the `outages` (`LifetimeTracker.outages`, lengths in
    whole rows) that outlasted its age, a Kaplan-Meier estimate (outages still going on are
    censored). Its own outages weigh one each; the other offers' weigh `pool` together.
    Where no outage lasted that long, its age: an outage is expected to last as long again;
    where the estimate never reaches `odds` (the longest rests censored), the longer of its
    age and the longest rest seen. So never more than the longer of its age and the longest
    outage less its age."""
    off, length, ended = outages
    keep = (length > age) & ~((off == offer) & ~ended)  # its own under way is this one
    rest = length[keep] - age  # rows, >= 1
    if rest.size == 0:
        return float(age)
    own = off[keep] == offer
    others = rest.size - int(np.count_nonzero(own))
    weight = np.where(own, 1.0, pool / max(others, 1))
    # Kaplan-Meier by whole rows: at each rest r, the weight of the outages that ended
    # there over the weight of those that lasted at least r (tied ends one after another
    # give the same product).
    at = np.bincount(rest, weights=weight)
    done = ended[keep]
    ends = np.bincount(rest[done], weights=weight[done], minlength=at.size)
    at_risk = np.cumsum(at[::-1])[::-1]
    hazard = np.divide(ends, at_risk, out=np.zeros(at.size), where=ends > 0)
    survival = np.cumprod(1.0 - hazard)
    reached = np.flatnonzero((ends > 0) & (survival <= 1.0 - odds + 1e-12))
    if reached.size:
        return float(reached[0])
    return float(max(age, at.size - 1))  # beyond what was seen: at least its longest
