"""Replay policies over one window of a trace, through the same loop the live system runs.

Every policy sees the same realized world: one `SignalGrid`, with spot gaps filled once by
a seeded hazard, and the same jobs. A fresh simulated provider and fake clock per policy.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from orchestrator.clock import FakeClock, utc
from orchestrator.costs import JobOfferFit
from orchestrator.errors import InputError
from orchestrator.loop import Controller, EventLog, LoopOptions
from orchestrator.model import CostSettings, Event, FleetState, JobSpec, Market, Offer
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.traces import Trace
from orchestrator.signals.view import (
    DEFAULT_LOOKBACK_S,
    Samples,
    grid_from_samples,
    list_priors,
)
from policies.base import Policy
from policies.oracle import Hindsight, Oracle
from providers.sim import SimProvider, realize_spot

ProgressFn = Callable[[str, int, int], None]  # policy, ticks done, ticks total


@dataclass(frozen=True, slots=True)
class PolicyRun:
    """What one policy did: the final fleet, every event, and cumulative totals per tick."""

    policy: str
    fleet: FleetState
    events: tuple[Event, ...]
    times_s: np.ndarray
    cumulative_usd: np.ndarray
    cumulative_kg_co2: np.ndarray
    end_s: float


@dataclass(frozen=True, slots=True)
class Replay:
    jobs: tuple[JobSpec, ...]
    grid: SignalGrid
    feasible: np.ndarray  # bool per job: could finish by its deadline on the fastest offer
    runs: tuple[PolicyRun, ...]
    carbon_usd_per_tonne: float
    seed: int
    config: dict[str, object] = field(default_factory=dict)


def replay_window(jobs: Sequence[JobSpec], tick_s: int) -> tuple[datetime, datetime]:
    """From the earliest start (floored to a tick) to the latest deadline."""
    start = min(j.start for j in jobs)
    epoch = int(start.timestamp())
    start = datetime.fromtimestamp(epoch - epoch % tick_s, tz=start.tzinfo)
    return utc(start), utc(max(j.deadline for j in jobs))


def build_grid(
    trace: Trace,
    jobs: Sequence[JobSpec],
    tick_s: int,
    seed: int,
    *,
    samples: Samples | None = None,
    spot_capacity: float = 4.0,
    history_s: float = DEFAULT_LOOKBACK_S,
) -> SignalGrid:
    """The realized world for these jobs: offers some job may use, spot gaps filled.

    With `samples` (what `signals poll` recorded: a trace directory's samples log), each
    tick's row is what the live controller knew at that instant, by the live view's rule
    (`signals.view.grid_from_samples`: counted from observation, max ages, priors where
    nothing counts, `spot_capacity` instances assumed where capacity is unknown), so a
    replay of a live period decides on what the live policy saw. That includes the
    history a live frame carries: the grid begins `history_s` (whole ticks) before the
    window, and the replay runs from `first_tick` (a trace's grid has no such rows)."""
    if not history_s >= 0:
        raise ValueError(f"history_s must be >= 0 seconds, got {history_s}")
    start, end = replay_window(jobs, tick_s)

    def usable(offer: Offer) -> bool:
        return any(job.allows(offer.gpu_type) for job in jobs)

    grid = SignalGrid.build(trace, start, end, tick_s, keep_offer=usable)
    if samples is not None:
        return grid_from_samples(
            samples,
            grid.offers,
            start.timestamp() - (history_s // tick_s) * tick_s,
            end.timestamp(),
            tick_s=tick_s,
            priors=list_priors(grid.offers, spot_capacity),
        )
    return realize_spot(grid, seed)


def first_tick(jobs: Sequence[JobSpec], grid: SignalGrid) -> int:
    """The grid's tick where `jobs`' replay window begins (0 unless history precedes it)."""
    return max(0, grid.tick_of(replay_window(jobs, grid.tick_s)[0]))


def check_home_regions(jobs: Sequence[JobSpec], grid: SignalGrid) -> None:
    """Every job's home region must sell an on-demand instance the job may use."""
    homes: dict[str, set[str]] = {}
    for o in grid.offers:
        if o.market is Market.ON_DEMAND:
            homes.setdefault(o.region, set()).add(o.gpu_type)
    for i, job in enumerate(jobs):
        types = homes.get(job.home_region, set())
        if not any(job.allows(t) for t in types):
            regions = sorted(r for r, ts in homes.items() if any(job.allows(t) for t in ts))
            raise InputError(
                "jobs",
                f"job {job.id!r} (entry {i}) home_region",
                "a region of the trace with an on-demand offer of an allowed GPU type",
                got=repr(job.home_region),
                fix="use one of: " + ", ".join(regions)
                if regions
                else "allow more GPU types or use another trace",
            )


def feasible_jobs(jobs: Sequence[JobSpec], grid: SignalGrid) -> np.ndarray:
    """A job is feasible when the fastest on-demand offer it may use, priced at its start,
    finishes it by the deadline. Infeasible jobs are reported apart, not as misses."""
    fit = JobOfferFit.build(jobs, grid.offers)
    on_demand = np.array([o.market is Market.ON_DEMAND for o in grid.offers])
    priced = ~np.isnan(grid.usd_per_hour)
    out = np.zeros(len(jobs), dtype=bool)
    for j, job in enumerate(jobs):
        k = min(grid.tick_of(job.start), grid.n_ticks - 1)
        ok = on_demand & priced[k] & (fit.rate[j] > 0)
        if not ok.any():
            continue
        hours = job.cold_start_h + job.work_gpu_hours / float(fit.rate[j][ok].max())
        out[j] = job.start + timedelta(hours=hours) <= job.deadline
    return out


def run_policy(
    policy: Policy,
    jobs: Sequence[JobSpec],
    grid: SignalGrid,
    *,
    options: LoopOptions,
    progress: ProgressFn | None = None,
    observe: Callable[[int, FleetState], None] | None = None,
    start_tick: int = 0,
) -> PolicyRun:
    """Run `policy` over the ticks of `grid` from `start_tick` (the rows before it are
    history only) until all jobs are done; `observe(k, fleet)` sees the fleet after each
    tick k (read it, do not keep it: it changes)."""
    if isinstance(policy, Oracle) and policy.hindsight is None:
        policy = policy.with_hindsight(Hindsight.of(grid))  # the oracle sees the realized grid
    n = grid.n_ticks
    if not 0 <= start_tick < n:
        raise ValueError(f"start_tick must be in [0, {n}), got {start_tick}")
    clock = FakeClock(grid.time_of(start_tick))
    provider = SimProvider(grid, clock, cluster=options.cluster)
    log = EventLog()
    controller = Controller(jobs, grid, provider, policy, log, options)
    ran = n - start_tick
    times = np.empty(ran + 1)
    usd = np.empty(ran + 1)
    kg = np.empty(ran + 1)
    last = 0  # ticks run, less one
    every = max(1, ran // 200)
    for i in range(ran):
        k = start_tick + i
        now = grid.time_of(k)
        clock.set(now)
        controller.tick(now)
        if observe is not None:
            observe(k, controller.fleet)
        times[i], usd[i], kg[i] = (
            now.timestamp(),
            controller.fleet.usd.sum(),
            controller.fleet.kg_co2.sum(),
        )
        last = i
        if progress is not None and i % every == 0:
            progress(policy.name, i, ran)
        if controller.all_done:
            break
    end = grid.time_of(min(start_tick + last + 1, n))
    clock.set(end)
    controller.finish(end)
    times[last + 1], usd[last + 1], kg[last + 1] = (
        end.timestamp(),
        controller.fleet.usd.sum(),
        controller.fleet.kg_co2.sum(),
    )
    if progress is not None:
        progress(policy.name, ran, ran)
    return PolicyRun(
        policy=policy.name,
        fleet=controller.fleet,
        events=tuple(log.events),
        times_s=times[: last + 2],
        cumulative_usd=usd[: last + 2],
        cumulative_kg_co2=kg[: last + 2],
        end_s=end.timestamp(),
    )


def run_policies(
    policies: Sequence[Policy],
    jobs: Sequence[JobSpec],
    grid: SignalGrid,
    *,
    options: LoopOptions,
    progress: ProgressFn | None = None,
    start_tick: int = 0,
) -> tuple[PolicyRun, ...]:
    """Each policy over the same jobs on the same grid, one after the other, each on a
    fresh simulated provider and clock (`run_policy`)."""
    return tuple(
        run_policy(p, jobs, grid, options=options, progress=progress, start_tick=start_tick)
        for p in policies
    )


def run_replay(
    trace: Trace,
    jobs: Sequence[JobSpec],
    policies: Sequence[Policy],
    *,
    tick_s: int = 600,
    seed: int = 0,
    carbon_usd_per_tonne: float = 0.0,
    settings: CostSettings | None = None,
    progress: ProgressFn | None = None,
    samples: Samples | None = None,
) -> Replay:
    if not jobs:
        raise InputError("jobs", "jobs", "at least one job")
    if not math.isfinite(carbon_usd_per_tonne) or carbon_usd_per_tonne < 0:
        raise InputError(
            "", "--carbon-price", "a price >= 0 USD per tonne", got=carbon_usd_per_tonne
        )
    grid = build_grid(trace, jobs, tick_s, seed, samples=samples)
    check_home_regions(jobs, grid)
    start_tick = first_tick(jobs, grid)  # after the history rows of a replay of samples
    config = {
        "tick_s": tick_s,
        "seed": seed,
        "carbon_usd_per_tonne": carbon_usd_per_tonne,
        "start": grid.time_of(start_tick).isoformat(),
        "end": grid.time_of(grid.n_ticks).isoformat(),
        "offers": len(grid.offers),
        "jobs": len(jobs),
    }
    return replay_on_grid(
        jobs,
        grid,
        policies,
        carbon_usd_per_tonne=carbon_usd_per_tonne,
        seed=seed,
        settings=settings,
        progress=progress,
        config=config,
        start_tick=start_tick,
    )


def replay_on_grid(
    jobs: Sequence[JobSpec],
    grid: SignalGrid,
    policies: Sequence[Policy],
    *,
    carbon_usd_per_tonne: float = 0.0,
    seed: int = 0,
    settings: CostSettings | None = None,
    progress: ProgressFn | None = None,
    config: Mapping[str, object] | None = None,
    start_tick: int = 0,
) -> Replay:
    """Every policy over `grid` for `jobs`, from `start_tick` (`run_policy`). The replay's
    config is `config`, else the grid's tick, start and end."""
    settings = dataclasses.replace(
        settings or CostSettings(), carbon_usd_per_tonne=carbon_usd_per_tonne
    )
    options = LoopOptions(cluster="replay", settings=settings)
    return Replay(
        jobs=tuple(jobs),
        grid=grid,
        feasible=feasible_jobs(jobs, grid),
        runs=run_policies(
            policies, jobs, grid, options=options, progress=progress, start_tick=start_tick
        ),
        carbon_usd_per_tonne=carbon_usd_per_tonne,
        seed=seed,
        config=dict(config)
        if config is not None
        else {
            "tick_s": grid.tick_s,
            "start": grid.time_of(start_tick).isoformat(),
            "end": grid.time_of(grid.n_ticks).isoformat(),
        },
    )
