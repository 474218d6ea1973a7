"""`spot-failover`: SkyPilot managed jobs with the EAGER_NEXT_REGION recovery strategy.

Source: SkyPilot, `sky/jobs/recovery_strategy.py`, `EagerFailoverStrategyExecutor.recover()`:
after a preemption it first relaunches with the preempted region blocked
(`blocked_resources={launched_resources.copy(region=...)}`); if that launch fails it retries
with every region allowed, sleeping between attempts until capacity comes back. The launch
itself goes to SkyPilot's optimizer, which picks the cheapest feasible resources. Managed
jobs here ask for `use_spot: true` and no on-demand fallback.

Rule, exactly:
- Candidates for a WAITING job j: spot offers in any region, priced now, whose GPU the job
  may use and whose `spot_capacity` can take its instances (NaN capacity: unavailable).
- If the job was preempted before (`fleet.preempted_offer[j] >= 0`), candidates in that
  offer's (cloud, region) are excluded -- unless nothing else is available, in which case
  that region is allowed again.
- Launch on the candidate with the lowest dollars per unit of progress,
  ``usd_per_hour * instances / rate`` (ties: lowest offer index). No candidate: keep waiting
  (SkyPilot keeps retrying). On-demand offers are never used.
- Jobs holding an instance stay where they are; PENDING and DONE jobs are left alone.

Difference from SkyPilot, stated: a policy sees no retry counter, so "the first retry" is
every tick the job waits after a preemption while another region has capacity. SkyPilot
would, after one failed attempt elsewhere, also allow the preempted region when other
regions come back later; here the preempted region stays last choice until the job runs
again. SkyPilot's optimizer ranks by $/h for the requested accelerator; ranking by $ per
unit of progress is the same when all candidates have one GPU type and generalises it.

Difference from SkyNomad's UP(S) (its `multi_region_rc_cr_threshold_eager_failover`
strategy, which moves "the last active region" to the end of its price order): there the
last active region is the one where the job held an instance at the start of some tick, so
an instance launched and preempted before the next tick never becomes it; here the blocked
region is that of the most recent preemption, whatever the instance's age. After a launch
that dies within its first tick, UP(S) keeps skipping the region preempted before it, and
this policy may go back there (issue 14 item 4: the 4.16 USD on two windows outside the
tuned suite). Matching it needs the offer a job held at the previous decision, which a
snapshot does not carry (`FleetState` would need a `last_held_offer` the loop keeps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.model import Decision, Intent, Phase
from policies.base import Snapshot
from policies.baselines._common import (
    candidates,
    jobs_in,
    masked_argmin,
    priced_offers,
    spot_mask,
)


@dataclass(frozen=True, slots=True)
class SpotFailover:
    """Cheapest available spot anywhere; after a preemption, another region first."""

    name = "spot-failover"

    def __call__(self, snapshot: Snapshot) -> Decision:
        js = jobs_in(snapshot, Phase.WAITING)
        if len(js) == 0:
            return Decision()
        fit = snapshot.fit
        offers = snapshot.offers
        with np.errstate(invalid="ignore"):
            has_capacity = snapshot.spot_capacity > 0
        cols = priced_offers(snapshot, spot_mask(snapshot) & has_capacity)
        cand = candidates(snapshot, fit, js, cols)
        mask, cost = cand.ok, cand.usd_per_gpu_h
        preempted = snapshot.fleet.preempted_offer[js]
        blocked = np.zeros_like(mask)
        if np.any(preempted >= 0):
            codes: dict[tuple[str, str], int] = {}
            region = np.array(
                [codes.setdefault((o.cloud, o.region), len(codes)) for o in offers], dtype=np.int64
            )
            blocked_region = np.where(preempted >= 0, region[np.maximum(preempted, 0)], -1)
            blocked = region[cols][None, :] == blocked_region[:, None]
        best, usd = masked_argmin(cost, mask & ~blocked, cols)
        fallback, usd_fallback = masked_argmin(cost, mask, cols)
        intents: dict[int, Intent] = {}
        for i, j in enumerate(js.tolist()):
            o, c, p = int(best[i]), float(usd[i]), int(preempted[i])
            where = f"{offers[p].cloud}:{offers[p].region}" if p >= 0 else ""
            note = f"; preempted in {where}, other regions first" if p >= 0 else ""
            if o < 0:
                o, c = int(fallback[i]), float(usd_fallback[i])
                if o < 0:
                    continue
                if p >= 0:
                    note = f"; no spot outside {where}, allowed it again"
            offer = offers[o]
            intents[j] = Intent(
                o,
                f"cheapest available spot: {offer.id} at {snapshot.usd_per_hour[o]:.2f} $/h, "
                f"{c:.3f} $/GPU-h{note}",
            )
        return Decision(intents)
