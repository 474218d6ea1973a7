"""`oracle`: the hindsight-optimal schedule of each job on a realized trace (DESIGN.md §5).

The oracle is the reference behind regret, ``J(policy) / J(oracle) - 1``. It is handed the
realized world (`Hindsight`: prices, spot capacity, carbon on the replay's tick grid) and, the
first time it sees a job, solves that job's schedule exactly by backward induction; then, every
tick, it asks for whatever the plan holds at that tick. Jobs share spot capacity through a
ledger: each plan reserves the spot instances it will hold, tick by tick, and the next job is
planned on the capacity left (jobs in the order they arrive, index order within a tick). So
with one job per replay it is the exact optimum, and with several it is each job's optimum
given the jobs before it: a schedule the fleet can really follow (two jobs never plan the
same last spot slot), not a bound below every policy. When the loop does not follow the plan
(work lost at a preemption), the job gives back its reservations from then on and is
re-planned from its realized state.

The model (`plan_job`), which is the loop's own accounting (`orchestrator.accounting`,
`orchestrator.executor`, `providers.sim`) written as a decision problem:

- At every tick boundary a job may keep its instance, pause (hold nothing), or launch on
  another offer. A launch pays the cold start ``job.cold_start_h`` plus the checkpoint's
  transfer time (``move_cost``; none when ``settings.transfer_time`` is off), billed from the
  launch at that offer's price and power, and the egress of ``move_cost`` when the
  checkpoint changes region. The first launch has no checkpoint: no egress, no transfer.
- During tick t a spot offer is usable only if its realized capacity at t covers the job's
  instances (the simulated provider preempts at the boundary otherwise); an offer is usable
  only while priced and allowed for the job.
- Progress accrues at ``fit.rate[j, o]`` once the cold start is over. Work is done when the
  remaining work fits in a tick's running time (the loop's 1e-9 s tolerance); the finishing
  tick is billed to the finishing instant, or whole with ``settings.bill_final_tick``.
- Objective ``J = dollars + carbon_usd_per_tonne * kgCO2 / 1000`` (location-based kgCO2);
  finishing by the deadline (within the replay metrics' 1e-6 s) is a hard constraint. When
  it cannot be met, the job finishes as soon as possible: on the offer that, launched now
  and kept, finishes first among those usable until then (cheapest among equals).

Solution method: backward induction over (tick, progress level, placement), placement being
"holding offer o, running" or "holding nothing, checkpoint in region L (or none yet)",
vectorized with numpy over the progress axis. A launch is one macro step: it holds the offer
through its cold start (its length rounded up to ticks) and lands RUNNING with the progress of
the partial tick, so an instance is never given up during its cold start. (That buys nothing
real; but the loop counts the checkpoint as moved at launch, so a launch given up early would
"move" it, transfer time included, for a tick's price: an artifact of the accounting that the
oracle does not exploit.) Progress lives on a grid of ``u`` GPU-hours, the largest unit of
which every increment (a full tick, and the partial tick after each startup, per offer) is a
whole multiple, so the DP is exact; only when that needs more than `max_progress_levels`
levels, or the DP more than `max_cells` state updates, is the grid coarsened and the partial
(then the full) increments rounded down: conservative, the plan still finishes, at a cost
a little above the optimum. Only levels reachable by then and from which the
deadline can still be met are computed; the decisions (one byte per location and level, one
bit per offer and level, per tick) are kept to walk the optimal path forward. Ties go to
launching earlier and to keeping an instance.

Use: ``Oracle(hindsight=Hindsight.of(grid))``; `orchestrator.replay.runner.run_policy` binds
the replay's grid to an oracle that has none (``make_policy("oracle")``).

Limits, stated: exact when the job checkpoints continuously (``checkpoint_interval_h = 0``)
or its plan never rides a spot offer into a capacity drop; with periodic checkpoints a
preemption's lost work is not in the model (the loop's realized state is re-planned).
Without bound hindsight (live use), the present signals are held constant: a persistence
forecast, not an oracle.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from orchestrator import units
from orchestrator.costs import move_cost, objective_usd
from orchestrator.model import (
    BoolArray,
    Decision,
    FloatArray,
    IntArray,
    Intent,
    Location,
    Market,
    Offer,
    Phase,
)
from policies.base import Snapshot

logger = logging.getLogger(__name__)

NO_OFFER = -1
_FINISH_TOL_S = 1e-9  # accounting.accrue: a job finishes when need_s <= run_s + 1e-9
_DEADLINE_TOL_S = 1e-6  # replay.metrics: met when finished_at_s <= deadline + 1e-6
_TIE = 1e-12  # relative: values this close are equal (sums in another order)


class GridLike(Protocol):
    """What `Hindsight.of` reads: `orchestrator.signals.grid.SignalGrid` has this shape."""

    @property
    def start_s(self) -> float: ...
    @property
    def tick_s(self) -> int: ...
    @property
    def offers(self) -> tuple[Offer, ...]: ...
    @property
    def usd_per_hour(self) -> FloatArray: ...
    @property
    def spot_capacity(self) -> FloatArray: ...
    @property
    def carbon_g_per_kwh(self) -> FloatArray: ...
    @property
    def carbon_marginal_g_per_kwh(self) -> FloatArray: ...
    @property
    def curtailing(self) -> BoolArray: ...


@dataclass(frozen=True, slots=True, eq=False)
class Hindsight:
    """The realized world on the replay's tick grid: row t holds over ``[start_s + t * tick_s,
    start_s + (t + 1) * tick_s)``; columns follow `offers`. `spot_capacity` is the realized
    capacity (instances; inf for on-demand)."""

    start_s: float
    tick_s: float
    offers: tuple[Offer, ...]
    usd_per_hour: FloatArray
    spot_capacity: FloatArray
    carbon_g_per_kwh: FloatArray
    carbon_marginal_g_per_kwh: FloatArray
    curtailing: BoolArray

    @property
    def n_ticks(self) -> int:
        return int(self.usd_per_hour.shape[0])

    @staticmethod
    def of(grid: GridLike) -> Hindsight:
        """The hindsight of a replay's signal grid (after spot gaps were realized)."""
        return Hindsight(
            start_s=float(grid.start_s),
            tick_s=float(grid.tick_s),
            offers=tuple(grid.offers),
            usd_per_hour=grid.usd_per_hour,
            spot_capacity=grid.spot_capacity,
            carbon_g_per_kwh=grid.carbon_g_per_kwh,
            carbon_marginal_g_per_kwh=grid.carbon_marginal_g_per_kwh,
            curtailing=grid.curtailing,
        )

    @staticmethod
    def persistent(snapshot: Snapshot, n_ticks: int) -> Hindsight:
        """The present held constant for `n_ticks` ticks (no future is known)."""
        held = snapshot.fleet.offer >= 0
        used = np.bincount(
            snapshot.fleet.offer[held],
            weights=snapshot.fit.instances[held, snapshot.fleet.offer[held]],
            minlength=len(snapshot.offers),
        )
        capacity = np.nan_to_num(
            np.asarray(snapshot.spot_capacity, dtype=np.float64) + used, nan=0.0, posinf=np.inf
        )

        def rows(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return np.repeat(np.asarray(a)[None, :], n_ticks, axis=0)

        return Hindsight(
            start_s=snapshot.now_s,
            tick_s=units.seconds(snapshot.tick_h),
            offers=tuple(snapshot.offers),
            usd_per_hour=rows(snapshot.usd_per_hour),
            spot_capacity=rows(capacity),
            carbon_g_per_kwh=rows(snapshot.carbon_g_per_kwh),
            carbon_marginal_g_per_kwh=rows(snapshot.carbon_marginal_g_per_kwh),
            curtailing=rows(snapshot.curtailing),
        )


@dataclass(frozen=True, slots=True, eq=False)
class JobProblem:
    """One job's decision problem from a tick boundary ("boundary 0") on, in plain arrays.

    K ticks (rows, to the end of the hindsight) x O offers (columns):
    `usd_per_hour[k, o]` is what holding the job's instances of o costs per hour during
    tick k (price x instances) and `kg_per_hour` its location-based emissions;
    `usable[k, o]` whether o may be held during tick k; `preempted[k, o]` whether an
    instance of o held into boundary k is taken away there (spot capacity short).
    `location[o]` indexes the checkpoint locations (cloud, region); `egress_usd[L, l]` and
    `startup_h[L, l]` are the egress and the whole startup (cold start plus transfer) of a
    launch at location l from a checkpoint at L, row ``n_locations`` being "no checkpoint
    yet". `deadline_s` counts from boundary 0. The job starts either running on
    `start_offer` or holding nothing with its checkpoint at `start_location` (-1: none).
    `finishing_tick_free` optimizes SkyNomad's reported convention: the tick in which the
    job finishes counts nothing (the loop still bills it).
    """

    tick_s: float
    deadline_s: float
    work_gpu_h: float
    rate: FloatArray
    usd_per_hour: FloatArray
    kg_per_hour: FloatArray
    usable: BoolArray
    preempted: BoolArray
    location: IntArray
    egress_usd: FloatArray
    startup_h: FloatArray
    carbon_usd_per_tonne: float = 0.0
    bill_final_tick: bool = False
    finishing_tick_free: bool = False
    start_offer: int = NO_OFFER
    start_location: int = -1

    @property
    def n_ticks(self) -> int:
        return int(self.usable.shape[0])

    @property
    def dp_ticks(self) -> int:
        """Ticks that start before the deadline: where the schedule must be."""
        return max(0, min(self.n_ticks, math.ceil(self.deadline_s / self.tick_s - 1e-9)))

    @property
    def n_locations(self) -> int:
        return int(self.egress_usd.shape[1])

    def objective_per_hour(self) -> FloatArray:
        j: FloatArray = objective_usd(
            self.usd_per_hour, self.kg_per_hour, self.carbon_usd_per_tonne
        )
        return j


@dataclass(frozen=True, slots=True, eq=False)
class JobPlan:
    """A job's schedule from boundary 0 of its problem, with what the loop will bill for it.

    Per boundary i (``first_tick + i`` on the hindsight grid) up to the finishing tick:
    `held[i]` the offer the job holds after the loop's preemption check (-1: none),
    `progress_gpu_h[i]` its progress (absolute) and `target[i]` the offer to hold during
    tick i (-1: none). `usd` and `kg_co2` are what the loop will bill for `target` (of which
    `finishing_tick_*` in the finishing tick); `objective_usd` is J of that accounting (less
    the finishing tick when it is free) and `dp_objective_usd` the DP's value: they agree
    when `exact`.
    """

    job_id: str
    first_tick: int
    held: IntArray
    target: IntArray
    progress_gpu_h: FloatArray
    finish_s: float  # absolute; NaN when the plan does not finish
    usd: float
    kg_co2: float
    finishing_tick_usd: float
    finishing_tick_kg_co2: float
    objective_usd: float
    dp_objective_usd: float
    meets_deadline: bool
    exact: bool
    fallback: bool
    progress_levels: int

    def index(self, tick: int) -> int:
        return tick - self.first_tick

    def follows(self, tick: int, held: int, progress_gpu_h: float, tol_gpu_h: float) -> bool:
        """Whether the loop is where the plan expects it at `tick`."""
        i = self.index(tick)
        if not 0 <= i < len(self.target):
            return False
        return int(self.held[i]) == held and progress_gpu_h >= self.progress_gpu_h[i] - tol_gpu_h


@dataclass(frozen=True, slots=True)
class Oracle:
    """Hindsight-optimal schedule per job (backward induction), jobs sharing spot capacity
    through a `SpotLedger`; the reference for regret.

    `max_progress_levels` and `max_cells` bound the work of one job's DP (see `plan_job`);
    `drop_finishing_tick` minimizes SkyNomad's reported cost (the tick in which a job
    finishes not counted; run the loop with ``bill_final_tick``) instead of what the loop bills.
    """

    hindsight: Hindsight | None = None
    max_progress_levels: int = 16384
    max_cells: int = 300_000_000
    drop_finishing_tick: bool = False
    _plans: dict[str, JobPlan] = field(default_factory=dict, init=False, repr=False, compare=False)
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    name = "oracle"

    def __post_init__(self) -> None:
        if self.max_progress_levels < 16:
            raise ValueError(f"max_progress_levels must be >= 16, got {self.max_progress_levels}")

    def with_hindsight(self, hindsight: Hindsight) -> Oracle:
        """A fresh oracle (no plans yet) that knows `hindsight`."""
        return Oracle(
            hindsight=hindsight,
            max_progress_levels=self.max_progress_levels,
            max_cells=self.max_cells,
            drop_finishing_tick=self.drop_finishing_tick,
        )

    @property
    def plans(self) -> dict[str, JobPlan]:
        """The current plan of every job seen so far, by job id (read-only use)."""
        return dict(self._plans)

    def __call__(self, snapshot: Snapshot) -> Decision:
        fleet = snapshot.fleet
        phase = fleet.phase
        active = np.flatnonzero(
            (phase == Phase.WAITING) | (phase == Phase.STARTING) | (phase == Phase.RUNNING)
        )
        if active.size == 0 or not snapshot.offers:
            return Decision()
        hindsight = self._hindsight(snapshot)
        cols = self._columns(snapshot, hindsight)
        # Which tick `now` is, to within the check below (not the tick in force: `tick_at`).
        k = round((snapshot.now_s - hindsight.start_s) / hindsight.tick_s)
        if abs(hindsight.start_s + k * hindsight.tick_s - snapshot.now_s) > 1e-3 or not (
            abs(units.seconds(snapshot.tick_h) - hindsight.tick_s) < 1e-6
        ):
            raise ValueError("the oracle's hindsight is on another tick grid than the loop")
        intents: dict[int, Intent] = {}
        for j in map(int, active):
            job = snapshot.jobs[j]
            current = int(fleet.offer[j])
            progress = float(fleet.progress_gpu_h[j])
            tol = 1e-6 * max(1.0, job.work_gpu_hours)
            plan = self._plans.get(job.id)
            if plan is None or not plan.follows(k, current, progress, tol):
                if phase[j] == Phase.STARTING:
                    continue  # let the cold start finish, then re-plan from RUNNING
                if plan is not None:
                    logger.info("oracle: %s left its plan at tick %d; re-planning", job.id, k)
                plan = self._solve(snapshot, j, k, hindsight, cols)
                self._plans[job.id] = plan
            i = plan.index(k)
            if not 0 <= i < len(plan.target):
                continue
            target = int(plan.target[i])
            if target == current:
                continue
            what = snapshot.offers[target].id if target >= 0 else "pause"
            kind = (
                "deadline unreachable: finish as soon as possible"
                if plan.fallback
                else ("hindsight-optimal plan")
            )
            intents[j] = Intent(
                None if target < 0 else target,
                f"{what}: {kind}, plan J {plan.objective_usd:.2f} USD",
            )
        return Decision(intents)

    # -- internals ---------------------------------------------------------------------
    def _hindsight(self, snapshot: Snapshot) -> Hindsight:
        if self.hindsight is not None:
            return self.hindsight
        cached = self._cache.get("persistent")
        horizon_s = max(j.deadline.timestamp() for j in snapshot.jobs) - snapshot.now_s
        tick_s = units.seconds(snapshot.tick_h)
        if isinstance(cached, Hindsight) and (
            cached.start_s + cached.n_ticks * cached.tick_s >= snapshot.now_s + horizon_s
        ):
            return cached
        logger.warning("oracle without hindsight: planning on the present held constant")
        n = max(1, math.ceil(horizon_s / tick_s) + 1)
        made = Hindsight.persistent(snapshot, n)
        self._cache["persistent"] = made
        return made

    def _columns(self, snapshot: Snapshot, hindsight: Hindsight) -> IntArray:
        """Hindsight column of each snapshot offer (-1: not in the hindsight)."""
        key = (id(snapshot.offers), id(hindsight))
        cached = self._cache.get("columns")
        if isinstance(cached, tuple) and cached[0] == key:
            cols: IntArray = cached[1]
            return cols
        if tuple(o.id for o in snapshot.offers) == tuple(o.id for o in hindsight.offers):
            cols = np.arange(len(snapshot.offers), dtype=np.int64)
        else:
            where = {o.id: c for c, o in enumerate(hindsight.offers)}
            cols = np.array([where.get(o.id, -1) for o in snapshot.offers], dtype=np.int64)
        self._cache["columns"] = (key, cols)
        return cols

    def _solve(
        self, snapshot: Snapshot, j: int, k: int, hindsight: Hindsight, cols: IntArray
    ) -> JobPlan:
        job = snapshot.jobs[j]
        ledger = self._cache.get("ledger")
        if not isinstance(ledger, SpotLedger) or ledger.hindsight is not hindsight:
            ledger = self._cache["ledger"] = SpotLedger(hindsight)
        ledger.release(job.id, k)
        problem = job_problem(
            snapshot,
            j,
            k,
            hindsight,
            cols,
            finishing_tick_free=self.drop_finishing_tick,
            reserved=ledger.reserved,
        )
        plan = plan_job(problem, max_levels=self.max_progress_levels, max_cells=self.max_cells)
        ledger.reserve(
            job.id,
            k,
            plan.target,
            cols,
            snapshot.fit.instances[j],
            np.array([o.market is Market.SPOT for o in snapshot.offers]),
        )
        progress0 = float(snapshot.fleet.progress_gpu_h[j])
        logger.info(
            "oracle: %s planned from tick %d: J %.2f USD, %s%s",
            job.id,
            k,
            plan.objective_usd,
            "meets its deadline" if plan.meets_deadline else "misses its deadline",
            "" if plan.exact else " (rounded progress grid)",
        )
        return JobPlan(
            job_id=job.id,
            first_tick=k,
            held=plan.held,
            target=plan.target,
            progress_gpu_h=plan.progress_gpu_h + progress0,
            finish_s=snapshot.now_s + plan.finish_s,
            usd=plan.usd,
            kg_co2=plan.kg_co2,
            finishing_tick_usd=plan.finishing_tick_usd,
            finishing_tick_kg_co2=plan.finishing_tick_kg_co2,
            objective_usd=plan.objective_usd,
            dp_objective_usd=plan.dp_objective_usd,
            meets_deadline=plan.meets_deadline,
            exact=plan.exact,
            fallback=plan.fallback,
            progress_levels=plan.progress_levels,
        )


class SpotLedger:
    """Spot instances the oracle's plans will hold, per hindsight tick and offer column, by
    job: what a job planned later must leave free."""

    def __init__(self, hindsight: Hindsight) -> None:
        self.hindsight = hindsight
        self.reserved: FloatArray = np.zeros_like(hindsight.spot_capacity, dtype=np.float64)
        self._by_job: dict[str, tuple[IntArray, IntArray, FloatArray]] = {}

    def reserve(
        self,
        job_id: str,
        first_tick: int,
        target: IntArray,
        cols: IntArray,
        instances: npt.NDArray[Any],
        spot: BoolArray,
    ) -> None:
        """Book `target` (offer held during tick ``first_tick + i``, -1 none) for `job_id`.
        An instance given up at a boundary (the plan moves on, or the job finished in the
        tick before) is still counted there: the loop frees it only after that boundary's
        launches were checked, so it books one tick more."""
        held = np.append(np.asarray(target, dtype=np.int64), NO_OFFER)
        left = np.flatnonzero(held[:-1] != held[1:]) + 1  # boundaries where a stay ends
        left = left[held[left - 1] >= 0]
        i = np.concatenate([np.flatnonzero(held >= 0), left])
        offer = np.concatenate([held[held >= 0], held[left - 1]])
        keep = spot[offer] & (cols[offer] >= 0)
        ticks = first_tick + i[keep]
        inside = ticks < self.reserved.shape[0]
        ticks, columns = ticks[inside], cols[offer[keep]][inside]
        amount = np.asarray(instances, dtype=np.float64)[offer[keep]][inside]
        np.add.at(self.reserved, (ticks, columns), amount)
        self._by_job[job_id] = (ticks, columns, amount)

    def release(self, job_id: str, from_tick: int) -> None:
        """Give back `job_id`'s bookings from `from_tick` on (it is about to be re-planned)."""
        booked = self._by_job.pop(job_id, None)
        if booked is None:
            return
        ticks, columns, amount = booked
        later = ticks >= from_tick
        np.subtract.at(self.reserved, (ticks[later], columns[later]), amount[later])


def job_problem(
    snapshot: Snapshot,
    j: int,
    k: int,
    hindsight: Hindsight,
    cols: IntArray | None = None,
    *,
    finishing_tick_free: bool = False,
    reserved: FloatArray | None = None,
) -> JobProblem:
    """Job `j`'s problem from hindsight tick `k` (= the snapshot's now) on, in the snapshot's
    offer order. At tick k itself, the snapshot's spot capacity (what other jobs left) also
    bounds what may be launched; later, the realized capacity less what other jobs' plans
    `reserved` (hindsight ticks x columns; see `SpotLedger`)."""
    job = snapshot.jobs[j]
    fit = snapshot.fit
    fleet = snapshot.fleet
    offers = snapshot.offers
    n_offers = len(offers)
    if cols is None:
        where = {o.id: c for c, o in enumerate(hindsight.offers)}
        cols = np.array([where.get(o.id, -1) for o in offers], dtype=np.int64)
    tick_s = hindsight.tick_s
    deadline_s = job.deadline.timestamp() - snapshot.now_s
    n_ticks = max(0, hindsight.n_ticks - k)  # the DP stops at the deadline; a fallback may not
    known = cols >= 0
    safe = np.where(known, cols, 0)
    rows = slice(k, k + n_ticks)
    price = np.where(known[None, :], hindsight.usd_per_hour[rows][:, safe], np.nan)
    realized = hindsight.spot_capacity[rows]
    if reserved is not None:
        realized = realized - reserved[rows]
    capacity = np.where(known[None, :], realized[:, safe], 0.0)
    carbon = np.where(known[None, :], hindsight.carbon_g_per_kwh[rows][:, safe], 0.0)
    instances = fit.instances[j].astype(np.float64)
    spot = np.array([o.market is Market.SPOT for o in offers], dtype=bool)
    rate = np.asarray(fit.rate[j], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        short = spot[None, :] & ~(capacity >= instances[None, :])
    usable = np.isfinite(price) & (rate > 0)[None, :] & ~short
    if n_ticks > 0:
        # Now: the snapshot's capacity is net of every job's instances (this one's too).
        mine = np.zeros(n_offers)
        if fleet.offer[j] >= 0:
            mine[fleet.offer[j]] = instances[fleet.offer[j]]
        with np.errstate(invalid="ignore"):
            free_now = (
                np.nan_to_num(np.asarray(snapshot.spot_capacity) + mine, nan=0.0, posinf=np.inf)
                >= instances
            )
        usable[0] &= ~spot | free_now
    kwh_per_hour = fit.power_kw[j] * fit.pue
    price0 = np.nan_to_num(price, nan=0.0)
    locations: list[Location] = []
    index: dict[tuple[str, str], int] = {}
    location = np.empty(n_offers, dtype=np.int64)
    for o, offer in enumerate(offers):
        key = (offer.cloud, offer.region)
        if key not in index:
            index[key] = len(locations)
            locations.append(offer.location)
        location[o] = index[key]
    n_loc = len(locations)
    egress = np.zeros((n_loc + 1, n_loc))
    startup = np.full((n_loc + 1, n_loc), job.cold_start_h)
    for a, src in enumerate(locations):
        for b, dst in enumerate(locations):
            move = move_cost(job, src, dst, snapshot.settings)
            egress[a, b] = move.egress_usd
            startup[a, b] = job.cold_start_h + move.transfer_h
    held = int(fleet.offer[j])
    running = fleet.phase[j] == Phase.RUNNING and held >= 0
    ckpt = int(fleet.checkpoint_offer[j])
    return JobProblem(
        tick_s=tick_s,
        deadline_s=deadline_s,
        work_gpu_h=max(0.0, job.work_gpu_hours - float(fleet.progress_gpu_h[j])),
        rate=rate,
        usd_per_hour=price0 * instances[None, :],
        kg_per_hour=units.kg_co2(kwh_per_hour[None, :], carbon),
        usable=usable,
        preempted=short,
        location=location,
        egress_usd=egress,
        startup_h=startup,
        carbon_usd_per_tonne=snapshot.settings.carbon_usd_per_tonne,
        bill_final_tick=snapshot.settings.bill_final_tick,
        finishing_tick_free=finishing_tick_free,
        start_offer=held if running else NO_OFFER,
        start_location=int(location[ckpt]) if ckpt >= 0 and not running else -1,
    )


@dataclass(frozen=True, slots=True, eq=False)
class Schedule:
    """`plan_job`'s answer, relative to the problem's boundary 0 (see `JobPlan`)."""

    held: IntArray
    target: IntArray
    progress_gpu_h: FloatArray
    finish_s: float
    usd: float
    kg_co2: float
    finishing_tick_usd: float
    finishing_tick_kg_co2: float
    objective_usd: float
    dp_objective_usd: float
    meets_deadline: bool
    exact: bool
    fallback: bool
    progress_levels: int


# --- the dynamic programme ------------------------------------------------------------------


def _exact_unit(increments: Sequence[float]) -> float | None:
    """The largest unit of which every increment is a whole multiple (ratios with
    denominators up to 10,000), or None."""
    incs = sorted({round(x, 12) for x in increments if x > 0}, reverse=True)
    if not incs:
        return None
    top = incs[0]
    fracs: list[Fraction] = []
    for x in incs:
        f = Fraction(x / top).limit_denominator(10_000)
        if abs(float(f) - x / top) > 1e-9 * max(1.0, x / top):
            return None
        fracs.append(f)
    den = math.lcm(*(f.denominator for f in fracs))
    return top * math.gcd(*(f.numerator * (den // f.denominator) for f in fracs)) / den


def _progress_unit(
    work_gpu_h: float, full: Sequence[float], partial: Sequence[float], max_levels: int
) -> tuple[float, bool]:
    """The progress grid: the largest unit every increment (full ticks, partial ticks after a
    startup) is a whole multiple of, when the work needs at most `max_levels` of it (exact).
    Else a unit that divides every full-tick increment, rounding partial ones down; else one
    that divides the largest, rounding the others down."""
    unit = _exact_unit([*full, *partial])
    if unit is not None and work_gpu_h / unit <= max_levels:
        return unit, True
    unit = _exact_unit(full)
    if unit is not None and work_gpu_h / unit <= max_levels:
        return unit / max(1, math.floor(max_levels * unit / work_gpu_h)), False
    top = max(full)
    return top / max(1, math.floor(max_levels * top / work_gpu_h)), False


def _band_cells(n_ticks: int, n_lev: int, gmax: int) -> int:
    """Progress levels the backward pass visits, summed over ticks (see its band)."""
    k = np.arange(n_ticks, dtype=np.int64)
    hi = np.minimum(n_lev, k * gmax + 1)
    lo = np.maximum(0, n_lev - (n_ticks - k) * gmax - 3)
    return int(np.maximum(hi - lo, 0).sum())


@dataclass(frozen=True, slots=True)
class _Launch:
    """A startup class: `ticks` ticks held from the launch; running the last `frac` of the
    last of them."""

    ticks: int
    frac: float


def plan_job(
    problem: JobProblem, *, max_levels: int = 16384, max_cells: int = 300_000_000
) -> Schedule:
    """The minimum-J schedule of `problem` (see the module docstring for the model).

    `max_levels` bounds the progress grid; `max_cells` the work (offers x startup classes x
    progress levels x ticks, about 10-25 ns each): beyond either, the grid is coarsened and
    the plan is conservative rather than exact (`Schedule.exact`)."""
    pb = problem
    n_ticks, n_offers = pb.dp_ticks, pb.usable.shape[1]
    if pb.work_gpu_h <= 0:
        return _account(
            pb, np.zeros(0, dtype=np.int64), dp_value=0.0, exact=True, fallback=False, levels=0
        )
    active = (
        (pb.rate > 0) & pb.usable[:n_ticks].any(axis=0)
        if n_ticks
        else np.zeros(n_offers, dtype=bool)
    )
    if pb.start_offer >= 0:
        active[pb.start_offer] = pb.rate[pb.start_offer] > 0
    if not active.any():
        return _fallback(pb)
    solved = _backward_forward(pb, np.flatnonzero(active), max_levels, max_cells)
    if solved is None:
        return _fallback(pb)
    targets, value, exact, levels = solved
    return _account(pb, targets, dp_value=value, exact=exact, fallback=False, levels=levels)


def _first_at_most(values: FloatArray, bound: float) -> IntArray:
    """Per row of a row-wise non-increasing matrix: the first column with value <= bound."""
    out = np.empty(values.shape[0], dtype=np.int64)
    for i, row in enumerate(values):
        out[i] = int(np.searchsorted(-row, -bound, side="left"))
    return out


def _location_groups(
    egress: FloatArray, cls: IntArray
) -> list[tuple[list[int], FloatArray, IntArray]]:
    """Rows of (egress, startup class) [L+1, L] grouped so that, within a group, every row
    L reads the same (egress, class) in every column but its own (the diagonal: its own
    region). Returns (rows, egress per column, class per column) per group; the last row
    (no checkpoint) has no diagonal and is grouped like the others."""
    n_rows, n_loc = egress.shape
    groups: list[tuple[list[int], list[tuple[float, int] | None]]] = []
    for row in range(n_rows):
        sig = [(float(egress[row, c]), int(cls[row, c])) for c in range(n_loc)]
        for members, cols in groups:
            fits = all(cols[c] is None or c == row or cols[c] == sig[c] for c in range(n_loc))
            if fits and (row >= n_loc or cols[row] is None or all(m != row for m in members)):
                members.append(row)
                for c in range(n_loc):
                    if c != row and cols[c] is None:
                        cols[c] = sig[c]
                break
        else:
            cols_new: list[tuple[float, int] | None] = [
                None if c == row else sig[c] for c in range(n_loc)
            ]
            groups.append(([row], cols_new))
    out = []
    for members, cols in groups:
        filled = [c if c is not None else (math.inf, 0) for c in cols]
        out.append(
            (
                members,
                np.array([e for e, _ in filled]),
                np.array([k for _, k in filled], dtype=np.int64),
            )
        )
    return out


@dataclass(slots=True)
class _Band:
    """Values of one tick on its band of progress levels ``[lo, lo + width)``, stored with
    `pad` inf columns on both sides: every level a transition can reach from the band of an
    earlier tick falls inside the array (out of band = inf: unreachable, or too late to
    finish). An empty band (width 0) is all inf."""

    lo: int
    width: int
    values: FloatArray  # [rows, pad + width + pad]


def _band_take(band: _Band, levels: IntArray, step: IntArray | None, pad: int) -> FloatArray:
    """Row r of `band` at ``levels + step[r]`` (every row at `levels` when `step` is None;
    with `step`, `levels` is a run of consecutive levels)."""
    values = band.values
    rows, stride = values.shape
    if band.width == 0:
        return np.full((rows, len(levels)), np.inf)
    if step is None:
        out: FloatArray = values[:, levels + (pad - band.lo)]
        return out
    # Each row's levels are one contiguous window of that row: pick the windows from a
    # strided view (a copy of rows, not a gather through a [rows, levels] index array).
    n = len(levels)
    s_row, s_col = values.strides
    windows = as_strided(values, (rows, stride - n + 1, n), (s_row, s_col, s_col), writeable=False)
    taken: FloatArray = windows[np.arange(rows), int(levels[0]) + (pad - band.lo) + step]
    return taken


def _backward_forward(  # noqa: PLR0912, PLR0915 - the DP kernel, whole (docstring)
    pb: JobProblem, act: IntArray, max_levels: int, max_cells: int
) -> tuple[IntArray, float, bool, int] | None:
    """Backward induction over the active offers `act`; then the optimal path forward.
    Returns (targets per boundary in problem offer indices, value, exact, levels), or None
    when the deadline cannot be met.

    Kept as one function on purpose: its arrays (value per tick x location x progress
    level, the banded transitions) are shared by every step, and each step reads as one
    recurrence in the order the module docstring states it; split, the state would travel
    through a dozen arguments and the hot loop would pay for the calls."""
    n_ticks = pb.dp_ticks
    n_loc = pb.n_locations
    tick_s = pb.tick_s
    tick_h = units.hours(tick_s)
    work = pb.work_gpu_h
    act = act[np.argsort(pb.location[act], kind="stable")]  # offers of a location together
    n_act = len(act)
    rate = pb.rate[act]
    loc = pb.location[act]
    usable = pb.usable[:n_ticks, act]
    jrate = np.where(usable, pb.objective_per_hour()[:n_ticks, act], 0.0)
    deadline = pb.deadline_s + _DEADLINE_TOL_S
    final_weight = 0.0 if pb.finishing_tick_free else 1.0

    # Startup classes (cold start + transfer), in ticks.
    keys = np.round(units.seconds(pb.startup_h) / tick_s, 9)
    uniq = sorted(set(keys.ravel().tolist()))
    cls = np.searchsorted(np.array(uniq), keys)  # [L+1, L]
    launches = []
    for c in uniq:
        n = max(1, math.ceil(c - 1e-9))
        launches.append(_Launch(n, min(1.0, max(0.0, n - c))))
    n_cls = len(launches)

    full = [float(r) * tick_h for r in rate]
    partial = [float(r) * lc.frac * tick_h for r in rate for lc in launches if lc.frac > 0]
    levels_cap = max_levels
    for _ in range(4):
        unit, exact = _progress_unit(work, full, partial, levels_cap)
        n_lev = max(1, math.ceil(work / unit - 1e-9))
        step_full = np.floor(rate * tick_h / unit + 1e-6).astype(np.int64)
        step_launch = [
            np.floor(rate * lc.frac * tick_h / unit + 1e-6).astype(np.int64) for lc in launches
        ]
        gmax = max(1, int(step_full.max()), *(int(s.max()) for s in step_launch))
        cells = _band_cells(n_ticks, n_lev, gmax) * n_act * (1 + n_cls)
        if cells <= max_cells or n_lev <= 16:
            break
        levels_cap = max(16, int(n_lev * max_cells / cells))
    levels = np.arange(n_lev, dtype=np.int64)
    with np.errstate(divide="ignore"):
        need_s = units.seconds((work - levels[None, :] * unit) / rate[:, None])  # [A, P]
    # Finishing is a suffix of levels: from fin_stay[o] in a kept tick, from fin_launch[c][o]
    # in the last tick of a launch of class c.
    fin_stay = _first_at_most(need_s, tick_s + _FINISH_TOL_S)
    fin_launch = [
        _first_at_most(need_s, lc.frac * tick_s + _FINISH_TOL_S)
        if lc.frac > 0
        else np.full(n_act, n_lev, dtype=np.int64)
        for lc in launches
    ]

    cum_j = np.vstack([np.zeros(n_act), np.cumsum(jrate * tick_h, axis=0)])
    cum_bad = np.vstack(
        [np.zeros(n_act, dtype=np.int64), np.cumsum(~usable, axis=0, dtype=np.int64)]
    )
    members = [np.flatnonzero(loc == ell) for ell in range(n_loc)]
    egress = pb.egress_usd
    rows_l = np.arange(n_loc + 1)[:, None]
    has = np.array([m.size > 0 for m in members])
    # Offers per location as a table (missing entries repeat the first: harmless in a min);
    # when every location has as many, `act` order makes the table a reshape of the rows.
    width_m = max(1, *(m.size for m in members))
    mem_tab = np.zeros((n_loc, width_m), dtype=np.int64)
    for ell, m in enumerate(members):
        if m.size:
            mem_tab[ell] = np.concatenate([m, np.full(width_m - m.size, m[0])])
    regular = all(m.size == width_m for m in members)
    # Per group: its rows, and of them the checkpoint locations (not the no-checkpoint row)
    # and those with offers of their own.
    groups = [
        (
            np.array(rows, dtype=np.int64),
            g_egress,
            g_cls,
            np.array([r for r in rows if r < n_loc], dtype=np.int64),
            np.array([r for r in rows if r < n_loc and has[r]], dtype=np.int64),
        )
        for rows, g_egress, g_cls in _location_groups(egress, cls)
    ]
    ell_all = np.arange(n_loc)

    max_hold = max(lc.ticks for lc in launches)
    pad = (max_hold + 1) * gmax + 8
    empty_r = _Band(0, 0, np.full((n_act, 2 * pad), np.inf))
    empty_n = _Band(0, 0, np.full((n_loc + 1, 2 * pad), np.inf))
    r_band: dict[int, _Band] = {}
    n_band: dict[int, _Band] = {}
    dec_lo = np.zeros(n_ticks, dtype=np.int64)
    dec_launch: list[npt.NDArray[np.integer[Any]]] = [np.zeros((0, 0), np.int8)] * n_ticks
    dec_stay: list[npt.NDArray[np.uint8]] = [np.zeros((0, 0), dtype=np.uint8)] * n_ticks
    dtype = np.int8 if len(pb.rate) < 127 else np.int32

    def finish_suffix(
        out: FloatArray,
        first: IntArray,
        lo: int,
        hi: int,
        base: FloatArray,
        row_rate: FloatArray,
        offset_s: float,
        tick: int,
    ) -> None:
        """Overwrite the finishing levels of `out` (band [lo, hi)) with the finishing cost:
        `base` plus the finishing tick billed from `offset_s` into it."""
        for o in (first < hi).nonzero()[0].tolist():  # np.flatnonzero, cheaper per call
            a = max(int(first[o]), lo)
            ns = need_s[o, a:hi]
            bill = tick_h if pb.bill_final_tick else units.hours(offset_s + ns)
            cost = base[o] + row_rate[o] * bill * final_weight
            if (tick + 1) * tick_s > deadline:
                cost = np.where(tick * tick_s + offset_s + ns <= deadline, cost, np.inf)
            out[o, a - lo :] = cost

    for k in range(n_ticks - 1, -1, -1):
        lo = max(0, n_lev - (n_ticks - k) * gmax - 3)
        hi = min(n_lev, k * gmax + 1)
        dec_lo[k] = lo
        if lo >= hi:
            r_band[k], n_band[k] = empty_r, empty_n
            continue
        width = hi - lo
        pv = levels[lo:hi]

        # Keep the instance one more tick.
        stay = _band_take(r_band.get(k + 1, empty_r), pv, step_full, pad)
        stay += (jrate[k] * tick_h)[:, None]
        finish_suffix(stay, fin_stay, lo, hi, np.zeros(n_act), jrate[k], 0.0, k)
        stay[~usable[k]] = np.inf

        # Launch: best offer per (startup class, location).
        best_loc = np.full((n_cls, n_loc, width), np.inf)
        arg_loc = np.zeros((n_cls, n_loc, width), dtype=np.int64)
        for c, lc in enumerate(launches):
            end = k + lc.ticks
            if end > n_ticks:
                continue
            ok = cum_bad[end] - cum_bad[k] == 0
            if not ok.any():
                continue
            val = _band_take(r_band.get(end, empty_r), pv, step_launch[c], pad)
            val += (cum_j[end] - cum_j[k])[:, None]
            if lc.frac > 0:
                last = end - 1
                finish_suffix(
                    val,
                    fin_launch[c],
                    lo,
                    hi,
                    cum_j[last] - cum_j[k],
                    jrate[last],
                    (1.0 - lc.frac) * tick_s,
                    last,
                )
            val[~ok] = np.inf
            cur, arg = best_loc[c], arg_loc[c]
            table = val.reshape(n_loc, width_m, width) if regular else None
            cur[:] = table[:, 0] if table is not None else val[mem_tab[:, 0]]
            arg[:] = mem_tab[:, :1]
            for col in range(1, width_m):
                other = table[:, col] if table is not None else val[mem_tab[:, col]]
                better = other < cur
                np.copyto(cur, other, where=better)
                np.copyto(arg, mem_tab[:, col : col + 1], where=better)

        # From each checkpoint location: the best launch anywhere (egress included). A
        # group of rows shares one minimum over the columns; a row whose own column wins
        # there takes the best of the others instead, then compares with its own region.
        z_min = np.full((n_loc + 1, width), np.inf)
        z_arg = np.zeros((n_loc + 1, width), dtype=np.int64)
        # All rows of a group at once: the best and the second best per column (the best
        # with its own row left out is the second best where the row's own column won).
        span = np.arange(width)
        for rows, g_egress, g_cls, own_rows, has_rows in groups:
            cand = best_loc[g_cls, ell_all] + g_egress[:, None]  # [L, width]
            cand[~has] = np.inf
            a1 = np.argmin(cand, axis=0)
            b1 = cand[a1, span]
            z_min[rows] = b1
            z_arg[rows] = a1
            if own_rows.size:
                own = a1[None, :] == own_rows[:, None]  # [rows, width]
                if own.any():
                    cand[a1, span] = np.inf
                    a2 = np.argmin(cand, axis=0)
                    b2 = cand[a2, span]
                    z_min[own_rows] = np.where(own, b2, b1)
                    z_arg[own_rows] = np.where(own, a2, a1)
            if has_rows.size:
                mine = (
                    best_loc[cls[has_rows, has_rows], has_rows]
                    + egress[has_rows, has_rows][:, None]
                )
                better = mine <= z_min[has_rows]
                z_min[has_rows] = np.where(better, mine, z_min[has_rows])
                z_arg[has_rows] = np.where(better, has_rows[:, None], z_arg[has_rows])
        wait = _band_take(n_band.get(k + 1, empty_n), pv, None, pad)
        # Ties (to rounding): launch now rather than later, keep rather than move.
        go = np.isfinite(z_min) & (z_min <= wait + _TIE * np.abs(wait))
        n_now = np.where(go, z_min, wait)
        chosen = arg_loc[cls[rows_l, z_arg], z_arg, np.arange(width)[None, :]]
        leave = n_now[loc]
        keep = ~(leave < stay - np.where(np.isfinite(stay), _TIE * np.abs(stay), 0.0))
        r_vals = np.empty((n_act, 2 * pad + width))
        r_vals[:, :pad] = np.inf
        r_vals[:, pad + width :] = np.inf
        np.copyto(r_vals[:, pad : pad + width], leave)
        np.copyto(r_vals[:, pad : pad + width], stay, where=keep)
        n_vals = np.empty((n_loc + 1, 2 * pad + width))
        n_vals[:, :pad] = np.inf
        n_vals[:, pad + width :] = np.inf
        n_vals[:, pad : pad + width] = n_now
        r_band[k], n_band[k] = _Band(lo, width, r_vals), _Band(lo, width, n_vals)
        dec_launch[k] = np.where(go, act[chosen], NO_OFFER).astype(dtype)
        dec_stay[k] = np.packbits(keep, axis=1)
        r_band.pop(k + max_hold + 1, None)
        n_band.pop(k + 2, None)

    # Forward: follow the decisions from the start state.
    if n_ticks == 0:
        return None
    pos = {int(o): i for i, o in enumerate(act)}
    zero = np.zeros(1, dtype=np.int64)
    if pb.start_offer >= 0 and pb.start_offer in pos:
        state_offer = pos[pb.start_offer]
        value = float(_band_take(r_band[0], zero, None, pad)[state_offer, 0])
        state_loc = int(loc[state_offer])
    else:
        state_offer = -1
        state_loc = pb.start_location if pb.start_location >= 0 else n_loc
        value = float(_band_take(n_band[0], zero, None, pad)[state_loc, 0])
    if not math.isfinite(value):
        return None
    targets: list[int] = []
    p, k = 0, 0
    while k < n_ticks:
        i = p - int(dec_lo[k])
        if state_offer >= 0:
            if not usable[k, state_offer]:
                state_loc, state_offer = int(loc[state_offer]), -1
            else:
                bit = (int(dec_stay[k][state_offer, i >> 3]) >> (7 - (i & 7))) & 1
                choice = int(dec_launch[k][int(loc[state_offer]), i])
                if bit or choice == int(act[state_offer]):
                    targets.append(int(act[state_offer]))
                    if p >= fin_stay[state_offer]:
                        return np.array(targets, dtype=np.int64), value, exact, n_lev
                    p += int(step_full[state_offer])
                    k += 1
                    continue
                state_loc, state_offer = int(loc[state_offer]), -1
        choice = int(dec_launch[k][state_loc, i])
        if choice < 0:
            targets.append(NO_OFFER)
            k += 1
            continue
        a = pos[choice]
        c = int(cls[state_loc, loc[a]])
        lc = launches[c]
        targets.extend([choice] * lc.ticks)
        if p >= fin_launch[c][a]:
            return np.array(targets, dtype=np.int64), value, exact, n_lev
        p += int(step_launch[c][a])
        k += lc.ticks
        state_offer, state_loc = a, int(loc[a])
    return None  # the decisions ran past the horizon: should not happen for a finite value


def _fallback(pb: JobProblem) -> Schedule:
    """Deadline unreachable: finish as soon as possible. Among the offers that, launched now
    (or kept), stay usable until the job is done, the earliest finish, then the lowest J;
    with none, the fastest offer never preempted in the hindsight, held to its end."""
    n_ticks = pb.n_ticks
    tick_h = units.hours(pb.tick_s)
    none = pb.n_locations
    ckpt = pb.start_location if pb.start_location >= 0 else none
    if pb.start_offer >= 0:
        ckpt = int(pb.location[pb.start_offer])
    jrate = np.nan_to_num(pb.objective_per_hour())
    best: tuple[float, float, int, int] | None = None  # (finish_h, J, offer, ticks)
    for o in np.flatnonzero(pb.rate > 0).tolist():
        if n_ticks == 0 or not pb.usable[0, o]:
            continue
        kept = o == pb.start_offer
        startup_h = 0.0 if kept else float(pb.startup_h[ckpt, pb.location[o]])
        finish_h = startup_h + pb.work_gpu_h / float(pb.rate[o])
        ticks = max(1, math.ceil(finish_h / tick_h - 1e-9))
        if ticks > n_ticks or not pb.usable[:ticks, o].all():
            continue
        cost = float(jrate[:ticks, o].sum()) * tick_h + (
            0.0 if kept else float(pb.egress_usd[ckpt, pb.location[o]])
        )
        key = (round(finish_h, 9), cost, o, ticks)
        if best is None or key < best:
            best = key
    if best is not None:
        return _account(
            pb,
            np.full(best[3], best[2], dtype=np.int64),
            dp_value=math.inf,
            exact=False,
            fallback=True,
            levels=0,
        )
    never_preempted = ~pb.preempted.any(axis=0) if n_ticks else np.ones(len(pb.rate), bool)
    priced = pb.usable.any(axis=0) if n_ticks else np.zeros(len(pb.rate), bool)
    pool = np.flatnonzero(never_preempted & priced & (pb.rate > 0))
    if pool.size == 0:
        return _account(
            pb,
            np.full(n_ticks, NO_OFFER, dtype=np.int64),
            dp_value=math.inf,
            exact=False,
            fallback=True,
            levels=0,
        )
    fastest = pool[pb.rate[pool] >= pb.rate[pool].max() - 1e-12]
    pick = int(fastest[int(np.argmin(jrate[0, fastest]))])
    if pb.start_offer in fastest.tolist():
        pick = pb.start_offer
    return _account(
        pb,
        np.full(n_ticks, pick, dtype=np.int64),
        dp_value=math.inf,
        exact=False,
        fallback=True,
        levels=0,
    )


def _account(
    pb: JobProblem, targets: IntArray, *, dp_value: float, exact: bool, fallback: bool, levels: int
) -> Schedule:
    """Bill `targets` as the loop would (accounting.accrue, executor, sim provider)."""
    tick_s = pb.tick_s
    work = pb.work_gpu_h
    n = len(targets)
    held_out = np.full(n, NO_OFFER, dtype=np.int64)
    progress_out = np.zeros(n)
    held = pb.start_offer
    ready_s = -math.inf
    ckpt = pb.start_location if pb.start_location >= 0 else pb.n_locations
    if held >= 0:
        ckpt = int(pb.location[held])
    progress = 0.0
    usd = kg = final_usd = final_kg = 0.0
    finish_s = math.nan
    for i in range(n):
        t0 = i * tick_s
        if held >= 0 and i < pb.n_ticks and pb.preempted[i, held]:
            held = NO_OFFER
        held_out[i] = held
        progress_out[i] = progress
        a = int(targets[i])
        if a != held:
            held = a
            if a >= 0:
                dst = int(pb.location[a])
                usd += float(pb.egress_usd[ckpt, dst])
                ready_s = t0 + units.seconds(float(pb.startup_h[ckpt, dst]))
                ckpt = dst
        if held < 0:
            continue
        t1 = t0 + tick_s
        run_from = min(max(ready_s, t0), t1)
        run_s = t1 - run_from
        r = float(pb.rate[held])
        need = units.seconds((work - progress) / r) if r > 0 else math.inf
        finishing = need <= run_s + _FINISH_TOL_S
        billed_h = units.hours(
            (run_from - t0) + need if finishing and not pb.bill_final_tick else tick_s
        )
        row = min(i, pb.n_ticks - 1)
        usd += float(pb.usd_per_hour[row, held]) * billed_h
        kg += float(pb.kg_per_hour[row, held]) * billed_h
        if finishing:
            final_usd = float(pb.usd_per_hour[row, held]) * billed_h
            final_kg = float(pb.kg_per_hour[row, held]) * billed_h
            finish_s = run_from + need
            held_out, progress_out = held_out[: i + 1], progress_out[: i + 1]
            targets = targets[: i + 1]
            break
        progress += units.hours(r * run_s)
    objective = objective_usd(usd, kg, pb.carbon_usd_per_tonne)
    if pb.finishing_tick_free:
        objective -= objective_usd(final_usd, final_kg, pb.carbon_usd_per_tonne)
    met = math.isfinite(finish_s) and finish_s <= pb.deadline_s + _DEADLINE_TOL_S
    return Schedule(
        held=held_out,
        target=np.asarray(targets, dtype=np.int64),
        progress_gpu_h=progress_out,
        finish_s=finish_s,
        usd=usd,
        kg_co2=kg,
        finishing_tick_usd=final_usd,
        finishing_tick_kg_co2=final_kg,
        objective_usd=objective,
        dp_objective_usd=dp_value,
        meets_deadline=met,
        exact=exact,
        fallback=fallback,
        progress_levels=levels,
    )
