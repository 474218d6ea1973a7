"""Pure helpers the baselines share: per-call offer and job facts as numpy arrays.

Every helper works on a subset of job rows `js` (an index array into `snapshot.jobs`), so a
policy pays for the job x offer matrices only for the jobs it actually has to decide about.
Nothing here keeps state between calls.

Feasibility, as every baseline uses it: job j can be launched on offer o now when o has a
price (`usd_per_hour` not NaN), the job may use o's GPU (`fit.rate[j, o] > 0`) and o can take
the job's instances now (`spot_capacity >= fit.instances[j, o]`; NaN capacity counts as 0,
on-demand capacity is inf).
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.model import BoolArray, FloatArray, IntArray, Market, Phase, Snapshot
from policies.costs import JobOfferFit

NO_OFFER = -1


def spot_mask(snapshot: Snapshot) -> BoolArray:
    """Per offer: True for the spot market."""
    offers = snapshot.offers
    return np.fromiter((o.market is Market.SPOT for o in offers), dtype=np.bool_,
                       count=len(offers))


def jobs_in(snapshot: Snapshot, *phases: Phase) -> IntArray:
    """Indices of the jobs whose phase is one of `phases`."""
    phase = snapshot.fleet.phase
    mask = phase == phases[0]
    for p in phases[1:]:
        mask |= phase == p
    return np.flatnonzero(mask).astype(np.int64)


def launchable(snapshot: Snapshot, fit: JobOfferFit, js: IntArray) -> BoolArray:
    """[len(js), n_offers]: job js[i] could be launched on offer o now (module doc)."""
    capacity = np.where(np.isnan(snapshot.spot_capacity), 0.0, snapshot.spot_capacity)
    priced = np.isfinite(snapshot.usd_per_hour)
    rate = fit.rate[js]
    return (rate > 0) & priced[None, :] & (capacity[None, :] >= fit.instances[js])


def usd_per_progress(snapshot: Snapshot, fit: JobOfferFit, js: IntArray) -> FloatArray:
    """[len(js), n_offers]: dollars per reference GPU-hour of progress,
    ``usd_per_hour * instances / rate``; inf where the job may not run or there is no price."""
    rate = fit.rate[js]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = snapshot.usd_per_hour[None, :] * fit.instances[js] / rate
    return np.where((rate > 0) & np.isfinite(out), out, np.inf)


def home_mask(snapshot: Snapshot, js: IntArray) -> BoolArray:
    """[len(js), n_offers]: offer o is in job js[i]'s home region (`Offer.region`)."""
    codes: dict[str, int] = {}
    offer_code = np.array([codes.setdefault(o.region, len(codes)) for o in snapshot.offers],
                          dtype=np.int64)
    jobs = snapshot.jobs
    job_code = np.array([codes.get(jobs[j].home_region, -1) for j in js], dtype=np.int64)
    mask: BoolArray = offer_code[None, :] == job_code[:, None]
    return mask


def masked_argmin(score: FloatArray, mask: BoolArray) -> tuple[IntArray, FloatArray]:
    """Per row: the column with the lowest finite `score` where `mask` holds (ties: the lowest
    index) and that score; `NO_OFFER` and inf for rows with none."""
    masked = np.where(mask, score, np.inf)
    if masked.shape[1] == 0:
        n = masked.shape[0]
        return np.full(n, NO_OFFER, dtype=np.int64), np.full(n, np.inf)
    idx = np.argmin(masked, axis=1).astype(np.int64)
    best = masked[np.arange(masked.shape[0]), idx]
    idx[~np.isfinite(best)] = NO_OFFER
    return idx, best


def current_offer_rows(snapshot: Snapshot, js: IntArray) -> tuple[IntArray, BoolArray]:
    """The offer each job in `js` holds (`NO_OFFER` for none) and whether it holds one."""
    cur = snapshot.fleet.offer[js]
    return cur, cur >= 0


def take(matrix: FloatArray, cur: IntArray, fill: float = math.nan) -> FloatArray:
    """Per row i: ``matrix[i, cur[i]]``, `fill` where ``cur[i] < 0``."""
    if len(cur) == 0:
        return np.zeros(0)
    vals = matrix[np.arange(len(cur)), np.maximum(cur, 0)]
    return np.where(cur >= 0, vals, fill)


def job_times_s(snapshot: Snapshot, js: IntArray) -> tuple[FloatArray, FloatArray]:
    """Start and deadline of the jobs in `js`, POSIX seconds."""
    jobs = snapshot.jobs
    start = np.array([jobs[j].start.timestamp() for j in js], dtype=np.float64)
    deadline = np.array([jobs[j].deadline.timestamp() for j in js], dtype=np.float64)
    return start, deadline


def job_floats(snapshot: Snapshot, js: IntArray, attr: str) -> FloatArray:
    """A float attribute of the `JobSpec`s in `js` (e.g. "work_gpu_hours", "cold_start_h")."""
    jobs = snapshot.jobs
    return np.array([float(getattr(jobs[j], attr)) for j in js], dtype=np.float64)
