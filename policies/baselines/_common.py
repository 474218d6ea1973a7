"""Pure helpers the baselines share: per-call offer and job facts as numpy arrays.

Helpers work on a subset of job rows `js` (indices into `snapshot.jobs`) and of offer
columns `cols` (indices into `snapshot.offers`), so a policy pays for job x offer matrices
only for the jobs it has to decide about and the offers it could choose. Nothing here keeps
state between calls.

Feasibility, as every baseline uses it: job j can be launched on offer o now when o has a
price (`usd_per_hour` not NaN), the job may use o's GPU (`fit.rate[j, o] > 0`) and o can take
the job's instances now (`spot_capacity >= fit.instances[j, o]`; NaN capacity counts as 0,
on-demand capacity is inf).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrator.costs import JobOfferFit
from orchestrator.model import BoolArray, FloatArray, IntArray, Market, Phase
from policies.base import Snapshot

NO_OFFER = -1
_SPOT = Market.SPOT  # enum lookups are slow on 3.11; these run per offer / per call
_STARTING = int(Phase.STARTING)
_RUNNING = int(Phase.RUNNING)


def spot_mask(snapshot: Snapshot) -> BoolArray:
    """Per offer: True for the spot market."""
    spot = _SPOT
    offers = snapshot.offers
    return np.fromiter((o.market is spot for o in offers), dtype=np.bool_, count=len(offers))


def jobs_in(snapshot: Snapshot, *phases: Phase) -> IntArray:
    """Indices of the jobs whose phase is one of `phases`."""
    phase = snapshot.fleet.phase
    mask = phase == int(phases[0])
    for p in phases[1:]:
        mask |= phase == int(p)
    js: IntArray = mask.nonzero()[0].astype(np.int64, copy=False)  # np.flatnonzero, cheaper
    return js


def priced_offers(snapshot: Snapshot, mask: BoolArray) -> IntArray:
    """Indices of the offers where `mask` holds and there is a price now: the columns a
    policy scores."""
    return np.flatnonzero(mask & np.isfinite(snapshot.usd_per_hour)).astype(np.int64)


def launchable(snapshot: Snapshot, fit: JobOfferFit, js: IntArray, cols: IntArray) -> BoolArray:
    """[len(js), len(cols)]: job js[i] could be launched on offer cols[k] now (module doc)."""
    capacity = snapshot.spot_capacity[cols]
    priced = np.isfinite(snapshot.usd_per_hour[cols])
    sub = np.ix_(js, cols)
    ok: BoolArray = (fit.rate[sub] > 0) & priced[None, :]
    if not np.all(capacity == np.inf):  # on-demand only: nothing more to check
        capacity = np.where(np.isnan(capacity), 0.0, capacity)
        ok &= capacity[None, :] >= fit.instances[sub]
    return ok


@dataclass(frozen=True, slots=True)
class Candidates:
    """Job x offer facts on the columns `cols` for the job rows `js` of one call."""

    cols: IntArray
    rate: FloatArray  # [len(js), len(cols)] reference GPU-hours per hour
    ok: BoolArray  # launchable now (module doc)
    usd_per_gpu_h: FloatArray  # usd_per_hour * instances / rate; inf where not launchable


@dataclass(frozen=True, slots=True)
class SubFit:
    """`fit.rate` and `fit.instances` on the job rows `js` and offer columns `cols`: what
    `candidates` gathers each call, for a policy that keeps it while its jobs stay."""

    rate: FloatArray
    instances: IntArray
    allowed: BoolArray  # rate > 0

    @staticmethod
    def of(fit: JobOfferFit, js: IntArray, cols: IntArray) -> SubFit:
        sub = np.ix_(js, cols)
        rate = fit.rate[sub]
        return SubFit(rate, fit.instances[sub], rate > 0)


def candidates(
    snapshot: Snapshot,
    fit: JobOfferFit,
    js: IntArray,
    cols: IntArray,
    sub: SubFit | None = None,
) -> Candidates:
    """`launchable` and dollars per unit of progress in one pass over the job x offer
    sub-matrix (`sub`: that sub-matrix of `fit`, where the caller keeps it)."""
    if sub is None:
        sub = SubFit.of(fit, js, cols)
    rate, instances = sub.rate, sub.instances
    price = snapshot.usd_per_hour[cols]
    ok = sub.allowed & np.isfinite(price)[None, :]
    capacity = snapshot.spot_capacity[cols]
    if not (capacity == np.inf).all():
        ok &= np.where(np.isnan(capacity), 0.0, capacity)[None, :] >= instances
    # Divided where launchable only (cheaper than np.where under an errstate).
    cost = np.divide(price[None, :] * instances, rate, out=np.full(ok.shape, np.inf), where=ok)
    return Candidates(cols, rate, ok, cost)


def home_mask(snapshot: Snapshot, js: IntArray, cols: IntArray) -> BoolArray:
    """[len(js), len(cols)]: offer cols[k] is in job js[i]'s home region
    (`JobSpec.home_region` == `Offer.region`)."""
    mask: BoolArray = snapshot.fit.home[np.ix_(js, cols)]
    return mask


def masked_argmin(
    score: FloatArray, mask: BoolArray, cols: IntArray
) -> tuple[IntArray, FloatArray]:
    """Per row: the offer ``cols[k]`` with the lowest finite ``score[:, k]`` where `mask`
    holds (ties: the lowest k) and that score; `NO_OFFER` and inf for rows with none."""
    n = mask.shape[0]
    if len(cols) == 0:
        return np.full(n, NO_OFFER, dtype=np.int64), np.full(n, np.inf)
    masked = np.where(mask, score, np.inf)
    k = np.argmin(masked, axis=1)
    best = masked[np.arange(n), k]
    offer = cols[k].astype(np.int64)
    offer[~np.isfinite(best)] = NO_OFFER
    return offer, best


def held_offer(snapshot: Snapshot, js: IntArray) -> IntArray:
    """The offer each job in `js` holds an instance of (STARTING or RUNNING), else -1."""
    fleet = snapshot.fleet
    phase = fleet.phase[js]
    holding = ((phase == _STARTING) | (phase == _RUNNING)) & (fleet.offer[js] >= 0)
    held: IntArray = np.where(holding, fleet.offer[js], NO_OFFER)
    return held


def take(matrix: FloatArray, js: IntArray, cur: IntArray, fill: float = math.nan) -> FloatArray:
    """Per i: ``matrix[js[i], cur[i]]``, `fill` where ``cur[i] < 0``."""
    vals = matrix[js, np.maximum(cur, 0)]
    return np.where(cur >= 0, vals, fill)


def job_facts(snapshot: Snapshot, js: IntArray) -> FloatArray:
    """[len(js), 4]: work_gpu_hours, cold_start_h, start and deadline (POSIX seconds)."""
    fit = snapshot.fit
    facts: FloatArray = np.column_stack(
        (fit.work_gpu_h[js], fit.cold_start_h[js], fit.start_s[js], fit.deadline_s[js])
    )
    return facts
