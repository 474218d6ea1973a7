"""`carbon-greedy`: run where the grid is cleanest right now, whatever it costs.

Source: DESIGN.md §5 -- the "follow the cleanest grid" spatial-shifting baseline that
carbon-aware scheduling studies compare against; no single paper owns it. It reads only the
current location-based (average) intensity: no forecast, no marginal signal, no prices.

Rule, exactly:
- Candidates for job j: on-demand offers (it does not gamble on preemption) in any region,
  priced now (a price is required to buy, not used to rank), whose GPU the job may use, with
  a known location-based intensity.
- Score: grams CO2 per reference GPU-hour of progress,
  ``carbon_g_per_kwh[o] * power_kw[j, o] * pue[o] / rate[j, o]``; best = lowest (ties: the
  lowest offer index).
- A WAITING job is launched on the best candidate (none: keep waiting).
- A job holding an instance (STARTING or RUNNING) moves to the best candidate only if its
  score is below ``(1 - hysteresis) * `` the score of the offer it holds now (scored the same
  way, at the current intensity); an unknown current intensity never triggers a move.
  Dollars, egress and the lost cold start are ignored: the policy is cost-blind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.model import Decision, Intent, Phase
from policies.base import Snapshot
from policies.baselines._common import (
    held_offer,
    jobs_in,
    launchable,
    masked_argmin,
    priced_offers,
    spot_mask,
)


@dataclass(frozen=True, slots=True)
class CarbonGreedy:
    """Lowest location-based gCO2 per unit of progress, on-demand only, with hysteresis."""

    hysteresis: float = 0.2
    name = "carbon-greedy"

    def __call__(self, snapshot: Snapshot) -> Decision:
        js = jobs_in(snapshot, Phase.WAITING, Phase.STARTING, Phase.RUNNING)
        if len(js) == 0 or len(snapshot.offers) == 0:
            return Decision()
        fit = snapshot.fit
        g_per_kwh_facility = snapshot.carbon_g_per_kwh * fit.pue
        cols = priced_offers(snapshot, ~spot_mask(snapshot) & np.isfinite(g_per_kwh_facility))
        sub = np.ix_(js, cols)
        rate = fit.rate[sub]
        with np.errstate(divide="ignore", invalid="ignore"):
            g_per_gpu_h = g_per_kwh_facility[cols][None, :] * fit.power_kw[sub] / rate
        g_per_gpu_h = np.where(rate > 0, g_per_gpu_h, np.inf)
        best, best_g = masked_argmin(g_per_gpu_h, launchable(snapshot, fit, js, cols), cols)

        cur = held_offer(snapshot, js)
        holding = cur >= 0
        at = np.maximum(cur, 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            cur_g = np.where(
                holding, g_per_kwh_facility[at] * fit.power_kw[js, at] / fit.rate[js, at], np.nan
            )
            better = best_g < (1.0 - self.hysteresis) * cur_g
        act = (best >= 0) & np.where(holding, better & (best != cur), True)

        intents: dict[int, Intent] = {}
        for i in np.flatnonzero(act).tolist():
            o = int(best[i])
            offer = snapshot.offers[o]
            why = (
                f"lowest carbon: {offer.id} in {offer.grid_zone} at "
                f"{snapshot.carbon_g_per_kwh[o]:.0f} g/kWh, {best_g[i]:.0f} gCO2/GPU-h"
            )
            if holding[i]:
                why += (
                    f" < {1.0 - self.hysteresis:g} x {cur_g[i]:.0f} gCO2/GPU-h on "
                    f"{snapshot.offers[int(cur[i])].id}"
                )
            intents[int(js[i])] = Intent(o, why)
        return Decision(intents)
