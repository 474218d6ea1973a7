"""How close can any online policy get to the hindsight oracle on a memoryless spot hazard?

carbon-year has no spot trace: the replay fills availability with a seeded two-state chain
per offer (`providers.sim.realize_spot`: lost at 0.10/h, back at 0.15/h). The oracle knows
the realized chain; an online policy can at best know its rates. For one job this module
computes both, exactly for the online side:

- `online_optimum`: the expected cost of the best policy that knows the rates and sees which
  offers are up now, by backward induction over (tick, progress, placement, availability of
  every offer): the optimum of the Markov decision process, no policy that does not see the
  future can do better on average;
- `clairvoyant_costs`: the optimum on each of a set of availability paths, known in full
  (the oracle's side), by the same recursion with the path in place of the expectation.

Their ratio, the price of not knowing the future, is what the hazard itself costs an online
policy; what a policy pays above it is its own (docs/policies.md).

The model of one job (simplified against the replay, the same for both sides): K spot
offers, each in its own region, priced per hour of the job's instances, constant over the
job; on-demand at one price and speed in every region, always up (run where the checkpoint
lies, beside the cheapest spot offer before there is one); every tick billed; a
launch pays a cold start (plus the checkpoint's transfer time and egress from where it
lies); a preemption takes the job back to its last checkpoint (written, as in the replay,
every `checkpoint_h` hours of running from the end of its cold start, at the end of the tick
that reaches it; a move or a pause checkpoints first; 0: continuously, a preemption loses
nothing); no other jobs compete for the slots.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from orchestrator.model import BoolArray, FloatArray, IntArray

_NEVER = 1e12  # cost of a state that cannot meet the deadline (finite: no inf - inf)


@dataclass(frozen=True, slots=True)
class Hazard:
    """A two-state availability chain per offer, rates per hour."""

    loss_per_hour: float
    return_per_hour: float

    @property
    def up_share(self) -> float:
        return self.return_per_hour / (self.loss_per_hour + self.return_per_hour)

    def step(self, tick_h: float) -> tuple[float, float]:
        """(P(up -> down), P(down -> up)) over one tick."""
        return (
            1.0 - math.exp(-self.loss_per_hour * tick_h),
            1.0 - math.exp(-self.return_per_hour * tick_h),
        )


@dataclass(frozen=True, slots=True)
class HazardJob:
    """One job as the model sees it (module docstring). Offer arrays are (K,), move arrays
    (K, K) from the checkpoint's offer to the launch's; rates are work units per hour."""

    spot_usd_per_h: FloatArray
    spot_rate: FloatArray
    egress_usd: FloatArray
    transfer_h: FloatArray
    od_usd_per_h: float
    od_rate: float
    work: float
    ticks: int  # decisions before the deadline
    tick_h: float
    cold_start_h: float
    checkpoint_h: float = 0.0  # how often it checkpoints while running (0: continuously)

    @property
    def k(self) -> int:
        return len(self.spot_usd_per_h)


@dataclass(frozen=True, slots=True)
class HazardBound:
    """Expected cost of the online optimum and of the clairvoyant one (mean over sampled
    paths, with its standard error)."""

    online_usd: float
    clairvoyant_usd: float
    clairvoyant_se_usd: float

    @property
    def ratio(self) -> float:
        return self.online_usd / self.clairvoyant_usd


@dataclass(frozen=True, slots=True)
class _Grid:
    """The job on a progress grid: units per tick warm, per launch from each checkpoint
    place (row K: no checkpoint yet), and the egress of that launch; and the states of a run
    on spot (`_runs`)."""

    levels: int
    warm: list[int]
    launch: IntArray  # (K + 1, K)
    egress: FloatArray  # (K + 1, K)
    od_warm: int
    od_launch: int
    runs: _Runs


@dataclass(frozen=True, slots=True)
class _Runs:
    """The states of a run on spot: on offer `offer[s]`, `lost[s]` units since the last
    checkpoint (what a preemption now takes back), `after[s]` the state one tick on, and
    `first[c, o]` the state after a launch on o from checkpoint place c. Continuous
    checkpoints: one state per offer, nothing lost."""

    offer: list[int]
    lost: list[int]
    after: list[int]
    first: IntArray  # (K + 1, K)


def _runs(job: HazardJob, wait: FloatArray, launch: IntArray, warm: list[int]) -> _Runs:
    """A run's state is (offer, ticks until its next checkpoint, units since the last): the
    clock starts when the launch is ready (`wait` hours into its tick, per checkpoint place
    and offer), and a checkpoint is written at the end of the tick whose end is
    `checkpoint_h` or more past the last (the replay's rule)."""
    k, h, every = job.k, job.tick_h, job.checkpoint_h
    steady = max(1, math.ceil(every / h - 1e-9)) if every > 0 else 1
    index: dict[tuple[int, int, int], int] = {}
    offer: list[int] = []
    lost: list[int] = []
    after: list[int] = []

    def state(o: int, ticks: int, units: int) -> int:
        key = (o, ticks, units)
        if key not in index:
            index[key] = len(offer)
            offer.append(o)
            lost.append(units)
            after.append(-1)
            nxt = (o, steady, 0) if ticks <= 1 else (o, ticks - 1, units + warm[o])
            after[index[key]] = state(*nxt) if nxt != key else index[key]
        return index[key]

    first = np.zeros((k + 1, k), dtype=np.int64)
    for src in range(k + 1):
        for dst in range(k):
            clock = max(h - float(wait[src, dst]), 0.0)
            ticks = max(0, math.ceil((every - clock) / h - 1e-9)) if every > 0 else 0
            units = int(launch[src, dst])
            first[src, dst] = state(dst, ticks, units) if ticks else state(dst, steady, 0)
    return _Runs(offer=offer, lost=lost, after=after, first=first)


def _grid(job: HazardJob, max_levels: int) -> _Grid:
    k, h = job.k, job.tick_h
    slowest = min([*job.spot_rate.tolist(), job.od_rate])
    unit = max(job.work / max_levels, slowest * h / 40.0)
    launch = np.zeros((k + 1, k), dtype=np.int64)
    egress = np.zeros((k + 1, k))
    wait = np.full((k + 1, k), job.cold_start_h)  # until the launch is ready, hours
    for src in range(k + 1):
        for dst in range(k):
            moved = src < k and src != dst
            wait[src, dst] += float(job.transfer_h[src, dst]) if moved else 0.0
            launch[src, dst] = round(
                float(job.spot_rate[dst]) * max(0.0, h - wait[src, dst]) / unit
            )
            egress[src, dst] = float(job.egress_usd[src, dst]) if moved else 0.0
    warm = [round(float(r) * h / unit) for r in job.spot_rate]
    return _Grid(
        levels=math.ceil(job.work / unit - 1e-9),
        warm=warm,
        launch=launch,
        egress=egress,
        od_warm=round(job.od_rate * h / unit),
        od_launch=round(job.od_rate * max(0.0, h - job.cold_start_h) / unit),
        runs=_runs(job, wait, launch, warm),
    )


def _ahead(values: FloatArray, units: int) -> FloatArray:
    """values[..., q, x] -> values[..., min(q + units, Q), x]."""
    top = values.shape[-2] - 1
    return values[..., np.minimum(np.arange(top + 1) + units, top), :]


def _behind(values: FloatArray, units: int) -> FloatArray:
    """values[..., q, x] -> values[..., max(q - units, 0), x]."""
    top = values.shape[-2] - 1
    return values[..., np.maximum(np.arange(top + 1) - units, 0), :]


def _solve(
    job: HazardJob,
    g: _Grid,
    up_now: Callable[[int], BoolArray],
    up_next: Callable[[int], BoolArray],
    expect: Callable[[FloatArray], FloatArray],
) -> FloatArray:
    """Backward induction. Placements: idle with the checkpoint at offer l (K of them), idle
    with none yet, on spot in each run state (`_Runs`: one per offer with continuous
    checkpoints), on on-demand at l (K). The last axis X of a value array is the
    availability state (online) or the path (clairvoyant); `up_now(t)` / `up_next(t)` give
    (X, K) availability at t and t + 1 on that axis, `expect` the value at t + 1 seen from t.
    Returns the cost from the start (idle, no checkpoint, no progress) per X."""
    k, h, top, runs = job.k, job.tick_h, g.levels, g.runs
    n_runs = len(runs.offer)
    idle0, none, spot0, od0 = 0, k, k + 1, k + 1 + n_runs
    x = up_now(0).shape[0]
    value = np.full((od0 + k, top + 1, x), _NEVER)
    value[:, top, :] = 0.0
    spot_h = [float(job.spot_usd_per_h[o]) * h for o in range(k)]
    od_h = job.od_usd_per_h * h
    for t in range(job.ticks - 1, -1, -1):
        now, nxt = up_now(t), up_next(t)
        idle = expect(value[: k + 1])  # idle with the checkpoint at each offer, or none
        demand = expect(value[od0:])
        # Through the tick into run state s: preempted at its end if the offer goes down,
        # back to the last checkpoint (none at all where that is no progress); done is done.
        through = np.empty((n_runs, top + 1, x))
        for s in range(n_runs):
            o, lost = runs.offer[s], runs.lost[s]
            down = _behind(value[idle0 + o], lost)
            down[: lost + 1] = value[none, 0]
            through[s] = np.where(nxt[:, o][None, :], value[spot0 + s], down)
        ride = expect(through)
        ride[:, top] = 0.0
        # A launch on o from checkpoint place c (row k: none), the best over o, and the best
        # over the other offers for a job running on c.
        launch = [
            [
                np.where(
                    now[:, o][None, :],
                    spot_h[o]
                    + g.egress[c, o]
                    + _ahead(ride[runs.first[c, o]], int(g.launch[c, o])),
                    _NEVER,
                )
                for o in range(k)
            ]
            for c in range(k + 1)
        ]
        any_launch = [np.minimum.reduce(row) for row in launch]
        od_launch = [od_h + _ahead(demand[c], g.od_launch) for c in range(k)]
        # A job running on spot o may leave it (a checkpoint first): idle, on-demand, or a
        # launch on another offer.
        leave = [
            np.minimum.reduce([idle[c], od_launch[c], *(row[o] for o in range(k) if o != c)])
            for c, row in enumerate(launch[:k])
        ]
        fresh = np.empty_like(value)
        for c in range(k + 1):  # idle
            home = c if c < k else 0
            fresh[idle0 + c] = np.minimum(np.minimum(idle[c], any_launch[c]), od_launch[home])
        for s in range(n_runs):  # on spot: keep running, or leave
            o = runs.offer[s]
            keep = np.where(
                now[:, o][None, :], spot_h[o] + _ahead(ride[runs.after[s]], g.warm[o]), _NEVER
            )
            fresh[spot0 + s] = np.minimum(leave[o], keep)
        for c in range(k):  # on on-demand where the checkpoint lies
            stay = od_h + _ahead(demand[c], g.od_warm)
            fresh[od0 + c] = np.minimum(np.minimum(idle[c], any_launch[c]), stay)
        fresh[:, top, :] = 0.0
        value = np.minimum(fresh, _NEVER)
    out: FloatArray = value[none, 0, :]
    return out


def _states(k: int) -> BoolArray:
    out: BoolArray = np.array(list(itertools.product([False, True], repeat=k)), dtype=bool)
    return out


def online_optimum(job: HazardJob, hazard: Hazard, *, max_levels: int = 800) -> float:
    """Expected cost of the optimal policy that knows `hazard` and sees which offers are up
    (the chain starts from its stationary law). 2**K availability states: keep K small."""
    states = _states(job.k)
    lose, back = hazard.step(job.tick_h)
    one = np.array([[1.0 - back, back], [lose, 1.0 - lose]])  # [from, to], 0 down 1 up
    move = np.ones((len(states), len(states)))
    for o in range(job.k):
        col = states[:, o].astype(np.int64)
        move *= one[col][:, col]
    g = _grid(job, max_levels)
    cost = _solve(job, g, lambda t: states, lambda t: states, lambda v: v @ move.T)
    start = np.prod(np.where(states, hazard.up_share, 1.0 - hazard.up_share), axis=1)
    return float(start @ cost)


def sample_paths(
    hazard: Hazard, k: int, ticks: int, tick_h: float, n: int, rng: np.random.Generator
) -> BoolArray:
    """(ticks + 1, n, k) availability paths of the chain, from its stationary law."""
    lose, back = hazard.step(tick_h)
    up = np.empty((ticks + 1, n, k), dtype=bool)
    up[0] = rng.random((n, k)) < hazard.up_share
    for t in range(ticks):
        u = rng.random((n, k))
        up[t + 1] = np.where(up[t], u >= lose, u < back)
    return up


def clairvoyant_costs(job: HazardJob, paths: BoolArray, *, max_levels: int = 800) -> FloatArray:
    """The optimum on each path of `paths` ((ticks + 1, n, k)), known in full."""
    if paths.shape[0] < job.ticks + 1 or paths.shape[2] != job.k:
        raise ValueError(f"paths {paths.shape} do not cover {job.ticks} ticks of {job.k} offers")
    g = _grid(job, max_levels)
    return _solve(job, g, lambda t: paths[t], lambda t: paths[t + 1], lambda v: v)


def hazard_bound(
    job: HazardJob, hazard: Hazard, *, samples: int = 150, seed: int = 0, max_levels: int = 800
) -> HazardBound:
    """`online_optimum` against the mean of `clairvoyant_costs` over `samples` paths."""
    paths = sample_paths(hazard, job.k, job.ticks, job.tick_h, samples, np.random.default_rng(seed))
    costs = clairvoyant_costs(job, paths, max_levels=max_levels)
    return HazardBound(
        online_usd=online_optimum(job, hazard, max_levels=max_levels),
        clairvoyant_usd=float(costs.mean()),
        clairvoyant_se_usd=float(costs.std() / math.sqrt(len(costs))),
    )
