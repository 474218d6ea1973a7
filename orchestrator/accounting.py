"""Accrue dollars, energy, carbon and progress over one tick interval, for all jobs at once.

Vectorized over jobs: a replay tick costs a handful of numpy operations whatever the fleet
size. Signals are those in force at the start of the interval (prices and intensities hold
for a tick). Billing runs from launch (cold start included) to termination; a job that
finishes inside the interval is billed up to its finishing instant, or for the whole tick
when `bill_final_tick` is set (the convention of SkyNomad's published numbers minus one).
Energy during the cold start is counted at full power (conservative).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator import units
from orchestrator.costs import JobOfferFit, marginal_intensity
from orchestrator.model import FleetState, FloatArray, Phase

_RUNNING = int(Phase.RUNNING)  # bound once: enum attribute lookups are slow on 3.11
_DONE = int(Phase.DONE)


@dataclass(frozen=True, slots=True)
class SignalRow:
    """Per-offer signals in force over one interval."""

    usd_per_hour: FloatArray
    carbon_g_per_kwh: FloatArray
    carbon_marginal_g_per_kwh: FloatArray
    curtailing: np.ndarray


def charge(
    fleet: FleetState,
    fit: JobOfferFit,
    row: SignalRow,
    jobs: np.ndarray,
    offers: np.ndarray,
    hours: FloatArray,
) -> None:
    """Add `hours` on `offers` to the jobs' dollars, energy and carbon (negative hours take
    back what was charged for time the job did not run: a live job that ended mid-tick)."""
    usd = row.usd_per_hour[offers] * fit.instances[jobs, offers] * hours
    kwh = fit.power_kw[jobs, offers] * fit.pue[offers] * hours
    avg = row.carbon_g_per_kwh[offers]
    marg = marginal_intensity(row.carbon_marginal_g_per_kwh[offers], avg, row.curtailing[offers])
    fleet.usd[jobs] += usd if np.isfinite(usd).all() else np.nan_to_num(usd)
    fleet.kwh[jobs] += kwh
    fleet.kwh_curtailed[jobs] += np.where(row.curtailing[offers], kwh, 0.0)
    fleet.kg_co2[jobs] += units.kg_co2(kwh, avg)
    fleet.kg_co2_marginal[jobs] += units.kg_co2(kwh, marg)


def accrue(
    fleet: FleetState,
    fit: JobOfferFit,
    row: SignalRow,
    work_gpu_h: FloatArray,
    checkpoint_interval_s: FloatArray,
    t0_s: float,
    t1_s: float,
    *,
    bill_final_tick: bool = False,
    model_progress: bool = True,
) -> np.ndarray:
    """Advance `fleet` (in place) from t0 to t1. Returns the indices of jobs that finished.

    With `model_progress` off (live jobs report their own progress), only dollars, energy
    and carbon accrue; progress, checkpoints and completion come from the provider."""
    jobs = (fleet.offer >= 0).nonzero()[0]  # np.flatnonzero, cheaper
    if jobs.size == 0 or t1_s <= t0_s:
        return jobs[:0]
    offers = fleet.offer[jobs]
    dt_s = t1_s - t0_s
    run_from = np.minimum(np.maximum(fleet.ready_at_s[jobs], t0_s), t1_s)  # np.clip, cheaper
    run_s = t1_s - run_from
    rate = fit.rate[jobs, offers]
    remaining = work_gpu_h[jobs] - fleet.progress_gpu_h[jobs]
    # Divided where rate > 0 only (cheaper than np.where under an errstate): no rate, no finish.
    need_h: FloatArray = np.divide(remaining, rate, out=np.full(rate.shape, np.inf), where=rate > 0)
    need_s = units.seconds(need_h)
    finishing = (need_s <= run_s + 1e-9) & model_progress
    used_run_s = np.where(finishing, need_s, run_s)
    billed_s = np.where(finishing & (not bill_final_tick), (run_from - t0_s) + need_s, dt_s)
    charge(fleet, fit, row, jobs, offers, units.hours(billed_s))
    if not model_progress:
        return jobs[:0]
    fleet.progress_gpu_h[jobs] += units.hours(rate * used_run_s)

    running = run_s > 0
    fleet.phase[jobs[running]] = _RUNNING
    # Restore counts as a checkpoint: the clock for periodic checkpoints starts at ready.
    # (The scatters below are skipped when they would write nothing: most ticks.)
    fresh = running & np.isnan(fleet.last_checkpoint_s[jobs])
    if fresh.any():
        fleet.last_checkpoint_s[jobs[fresh]] = run_from[fresh]
    due = running & (t1_s - fleet.last_checkpoint_s[jobs] >= checkpoint_interval_s[jobs])
    if due.any():
        fleet.checkpointed_gpu_h[jobs[due]] = fleet.progress_gpu_h[jobs[due]]
        fleet.last_checkpoint_s[jobs[due]] = t1_s

    done = jobs[finishing]
    if done.size:
        fleet.progress_gpu_h[done] = work_gpu_h[done]
        fleet.checkpointed_gpu_h[done] = work_gpu_h[done]
        fleet.finished_at_s[done] = run_from[finishing] + need_s[finishing]
        fleet.phase[done] = _DONE
    return done
