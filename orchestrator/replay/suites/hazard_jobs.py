"""The price of not knowing the future on carbon-year (`orchestrator.replay.hazard_bound`):
each job of the suite's windows as the model sees it, and the online optimum against the
clairvoyant one, job by job.

Per job: its `offers` cheapest spot offers per unit of progress (prices averaged over the
ticks to its deadline; up to `offers - 2` of them among those fast enough to finish
alone, so a job whose bargain is a slow L4 also has A100s to fall back on), egress and
transfer times between them from the catalog's routes, the cheapest on-demand offer per
unit of progress that finishes in time, and the job's own checkpoint interval (what a
preemption takes back; `continuous`: nothing, the bound as first measured). Costs are J at
the case's carbon price: an offer's dollars an hour plus its energy's carbon at the zone's
average intensity over those ticks (egress in dollars).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator import units
from orchestrator.costs import JobOfferFit, carbon_usd, move_matrices
from orchestrator.model import FloatArray, JobSpec, Market
from orchestrator.replay.hazard_bound import Hazard, HazardBound, HazardJob, hazard_bound
from orchestrator.replay.suites.base import SuiteCase
from orchestrator.replay.suites.case import case_grid
from orchestrator.replay.suites.pool import map_cases
from orchestrator.replay.suites.registry import SUITES
from orchestrator.signals.grid import SignalGrid
from providers.sim import DEFAULT_RETURN_PER_HOUR


def case_hazard(case: SuiteCase) -> Hazard:
    """The chain `case_grid` fills the case's spot availability with."""
    return Hazard(case.spot_loss_per_hour, DEFAULT_RETURN_PER_HOUR)


@dataclass(frozen=True, slots=True)
class JobBound:
    window: str
    job: str
    bound: HazardBound


_NEVER_WORTH = 1e6  # USD per hour: the spot offer of a job that has none


def hazard_job(
    grid: SignalGrid,
    case: SuiteCase,
    fit: JobOfferFit,
    moves: tuple[FloatArray, FloatArray],
    j: int,
    offers: int,
    continuous: bool = False,
) -> HazardJob:
    """Job `j` of `case` as `hazard_bound` sees it (module docstring); `moves` is
    `move_matrices` of the grid's offers."""
    job: JobSpec = case.jobs[j]
    tick_h = units.hours(grid.tick_s)
    first = min(grid.tick_of(job.start), grid.n_ticks - 1)
    ticks = int((job.deadline.timestamp() - (grid.start_s + first * grid.tick_s)) // grid.tick_s)
    rate = fit.rate[j]
    span = slice(first, first + max(ticks, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an offer unpriced throughout
        hourly = np.nanmean(grid.usd_per_hour[span], axis=0)
        intensity = np.nanmean(grid.carbon_g_per_kwh[span], axis=0)
    hourly = hourly * fit.instances[j]
    price = case.settings.carbon_usd_per_tonne
    if price > 0:  # J an hour: the dollars and the carbon at the average intensity
        kwh = fit.power_kw[j] * fit.pue
        hourly = hourly + carbon_usd(kwh, np.nan_to_num(intensity), price)
    per_progress = np.where(rate > 0, hourly / np.where(rate > 0, rate, 1.0), np.nan)
    usable = np.isfinite(per_progress)
    spot = np.array([o.market is Market.SPOT for o in grid.offers])
    need = job.work_gpu_hours / max(1e-9, ticks * tick_h - job.cold_start_h)
    by_price = [int(o) for o in np.argsort(np.where(usable, per_progress, np.inf)) if usable[o]]
    demand = [o for o in by_price if not spot[o]]
    if not demand:
        raise ValueError(f"job {job.id} has no priced on-demand offer to fall back on")
    in_time = [o for o in demand if rate[o] >= need]
    od = in_time[0] if in_time else max(demand, key=lambda o: rate[o])
    spots = [o for o in by_price if spot[o]]
    chosen = [o for o in spots if rate[o] >= need][: max(1, offers - 2)]
    chosen += [o for o in spots if o not in chosen][: offers - len(chosen)]
    chosen.sort(key=lambda o: per_progress[o])
    egress_pg, transfer_pg = moves
    if not chosen:  # no spot offer: one that is never worth taking
        chosen = [od]
    pick = np.ix_(chosen, chosen)
    size = job.checkpoint_size_gb
    return HazardJob(
        spot_usd_per_h=hourly[chosen] if spot[chosen[0]] else np.array([_NEVER_WORTH]),
        spot_rate=rate[chosen],
        egress_usd=size * egress_pg[pick],
        transfer_h=size * transfer_pg[pick],
        od_usd_per_h=float(hourly[od]),
        od_rate=float(rate[od]),
        work=job.work_gpu_hours,
        ticks=ticks,
        tick_h=tick_h,
        cold_start_h=job.cold_start_h,
        checkpoint_h=0.0 if continuous else job.checkpoint_interval_h,
    )


def case_bounds(
    case: SuiteCase,
    offers: int = 6,
    samples: int = 150,
    continuous: bool = False,
    seed: int = 0,
) -> list[JobBound]:
    """`hazard_bound` for every job of one case, on the suite's own hazard."""
    grid = case_grid(case)
    fit = JobOfferFit.build(case.jobs, grid.offers)
    moves = move_matrices(grid.offers, case.settings)
    hazard = case_hazard(case)
    return [
        JobBound(
            case.window,
            job.id,
            hazard_bound(
                hazard_job(grid, case, fit, moves, j, offers, continuous),
                hazard,
                samples=samples,
                seed=seed,
            ),
        )
        for j, job in enumerate(case.jobs)
    ]


def carbon_year_bounds(
    data_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    *,
    offers: int = 6,
    samples: int = 150,
    continuous: bool = False,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> list[JobBound]:
    """Every job of carbon-year's windows (`overrides` as the suite's options; the first
    carbon price's cases), case by case over up to `workers` processes."""
    options = dict(overrides or {})
    suite = SUITES["carbon-year"](data_dir, options)
    first = suite.cases[0].setting
    indices = [i for i, c in enumerate(suite.cases) if c.setting == first]

    def done(_: int, count: int) -> None:
        if progress is not None:
            progress(count, len(indices))

    out = map_cases(
        "carbon-year",
        data_dir,
        options,
        suite,
        indices,
        case_bounds,
        (offers, samples, continuous),
        workers,
        done,
    )
    return [b for i in indices for b in out[i]]


def window_rows(bounds: list[JobBound]) -> list[dict[str, Any]]:
    """Per window and over all: jobs, summed expected USD online and clairvoyant, their
    ratio (sums, as the suite's J / J(oracle)), the worst job's ratio."""
    groups: dict[str, list[JobBound]] = {}
    for b in bounds:
        groups.setdefault(b.window, []).append(b)
    if len(groups) > 1:
        groups["all"] = list(bounds)
    rows = []
    for window, rows_of in groups.items():
        online = sum(b.bound.online_usd for b in rows_of)
        clairvoyant = sum(b.bound.clairvoyant_usd for b in rows_of)
        worst = max(rows_of, key=lambda b: b.bound.ratio)
        rows.append(
            {
                "window": window,
                "jobs": len(rows_of),
                "online_usd": round(online, 2),
                "clairvoyant_usd": round(clairvoyant, 2),
                "ratio": round(online / clairvoyant, 4),
                "worst_job": f"{worst.job} {worst.bound.ratio:.3f}",
            }
        )
    return rows
