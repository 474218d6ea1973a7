"""`curtailment-threshold`: run only on clean or curtailed power, leave when it turns dirty.

Source: curtail-llm (2026), as summarised in DESIGN.md §5: train where the marginal grid
intensity is below 100 gCO2/kWh, and leave a zone after it has been above that for 600 s.

Rule, exactly:
- Marginal intensity per offer is `orchestrator.costs.marginal_intensity` (the marginal signal
  where known; else 0 while the zone curtails, else the average).
- An offer qualifies when its zone is curtailing or its marginal intensity is below
  `threshold_g_per_kwh`; it is "above" otherwise.
- Candidates for job j: qualifying on-demand offers in any region, priced now, whose GPU the
  job may use. Spot is not used: the rule is about where the energy comes from, and the
  source does not model preemption. Best candidate: a curtailing zone first, then the lowest
  dollars per unit of progress among the qualifying offers (the source says where to run, not
  which of the clean offers to buy; a user buys the cheapest). Deadlines are not looked at.
- A WAITING job is launched on the best candidate (none: keep waiting).
- A job holding an instance stays while its offer qualifies. Once its offer has been above for
  at least `leave_after_s`, it moves to the best candidate, or pauses when there is none.
  "How long above" counts the trailing ticks of `snapshot.history` (rows up to now, the last
  one being now) in which the offer was above, each worth one tick (`tick_h`); it is at most
  ``ceil(leave_after_s / tick)`` ticks, so the job leaves on the first tick where that many
  trailing rows are all above. Without history only the current tick is known: the job
  leaves as soon as its offer is above if one tick is at least `leave_after_s`, else stays.
  The history's columns are assumed to be `snapshot.offers` in order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrator.costs import marginal_intensity
from orchestrator.model import BoolArray, Decision, FloatArray, IntArray, Intent, Phase
from orchestrator.units import SECONDS_PER_HOUR
from policies.base import Snapshot
from policies.baselines._common import (
    candidates,
    held_offer,
    jobs_in,
    masked_argmin,
    priced_offers,
    spot_mask,
)

# Added to the score ($ per unit of progress) of offers that are not curtailing, so any
# curtailing offer ranks first.
_NOT_CURTAILING_PENALTY = 1e9


@dataclass(frozen=True, slots=True)
class CurtailmentThreshold:
    """Curtailing zones first, then marginal intensity < threshold; leave after a dwell."""

    threshold_g_per_kwh: float = 100.0
    leave_after_s: float = 600.0
    name = "curtailment-threshold"

    def _above(
        self, marginal_g_per_kwh: FloatArray, average_g_per_kwh: FloatArray, curtailing: BoolArray
    ) -> BoolArray:
        marginal = marginal_intensity(marginal_g_per_kwh, average_g_per_kwh, curtailing)
        with np.errstate(invalid="ignore"):
            clean = marginal < self.threshold_g_per_kwh
        above: BoolArray = ~(curtailing | clean)
        return above

    def _seconds_above(self, snapshot: Snapshot, cols: IntArray) -> FloatArray:
        """How long each offer in `cols` (all above now) has been above, from the history."""
        tick_s = snapshot.tick_h * SECONDS_PER_HOUR
        history = snapshot.history
        if history is None or tick_s <= 0:
            return np.full(len(cols), tick_s)
        needed = max(1, math.ceil(self.leave_after_s / tick_s - 1e-9))
        above = self._above(
            history.carbon_marginal_g_per_kwh(needed)[:, cols],
            history.carbon_g_per_kwh(needed)[:, cols],
            history.curtailing(needed)[:, cols] > 0.5,
        )
        trailing = np.cumprod(above[::-1], axis=0).sum(axis=0)
        return np.asarray(trailing * tick_s, dtype=np.float64)

    def __call__(self, snapshot: Snapshot) -> Decision:
        js = jobs_in(snapshot, Phase.WAITING, Phase.STARTING, Phase.RUNNING)
        if len(js) == 0 or len(snapshot.offers) == 0:
            return Decision()
        curtailing = np.asarray(snapshot.curtailing, dtype=np.bool_)
        marginal = marginal_intensity(
            snapshot.carbon_marginal_g_per_kwh, snapshot.carbon_g_per_kwh, curtailing
        )
        above_now = self._above(
            snapshot.carbon_marginal_g_per_kwh, snapshot.carbon_g_per_kwh, curtailing
        )

        cur = held_offer(snapshot, js)
        holding = cur >= 0
        leave = holding & above_now[np.maximum(cur, 0)]
        above_s = np.zeros(len(js))
        if leave.any():
            above_s[leave] = self._seconds_above(snapshot, cur[leave])
            leave &= above_s >= self.leave_after_s - 1e-6
        decide = np.flatnonzero(~holding | leave)
        if len(decide) == 0:
            return Decision()

        fit = snapshot.fit
        rows = js[decide]
        cols = priced_offers(snapshot, ~spot_mask(snapshot) & ~above_now)
        cand = candidates(snapshot, fit, rows, cols)
        penalty = np.where(curtailing[cols], 0.0, _NOT_CURTAILING_PENALTY)
        best, _ = masked_argmin(penalty[None, :] + cand.usd_per_gpu_h, cand.ok, cols)

        intents: dict[int, Intent] = {}
        for i, o in zip(decide.tolist(), best.tolist(), strict=True):
            if o >= 0:
                offer = snapshot.offers[o]
                why = (
                    f"{offer.id}: {offer.grid_zone} "
                    + ("curtailing" if curtailing[o] else "not curtailing")
                    + f", marginal {marginal[o]:.0f} g/kWh "
                    + f"(threshold {self.threshold_g_per_kwh:g})"
                )
            elif holding[i]:
                why = "no qualifying offer: pause"
            else:
                continue
            if holding[i]:
                c = int(cur[i])
                why = (
                    f"{snapshot.offers[c].grid_zone} above {self.threshold_g_per_kwh:g} g/kWh "
                    f"(marginal {marginal[c]:.0f}) for {above_s[i]:.0f} s "
                    f">= {self.leave_after_s:g} s; {why}"
                )
            intents[int(js[i])] = Intent(o if o >= 0 else None, why)
        return Decision(intents)
