"""`on-demand`: the static baseline most teams run today.

Source: the default of every cloud training setup (and the reference point of SkyPilot's and
Can't Be Late's evaluations): buy on-demand capacity in the job's home region and leave it
there until the job finishes.

Rule, exactly:
- Candidates for job j: on-demand offers whose `region` is `jobs[j].home_region`, priced now,
  whose GPU the job may use (`fit.rate[j, o] > 0`).
- A WAITING job is launched on the candidate with the lowest dollars per unit of progress,
  ``usd_per_hour[o] * instances[j, o] / rate[j, o]`` (ties: the lowest offer index). With no
  candidate it keeps waiting.
- A job that holds an instance is never moved or paused; PENDING and DONE jobs are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.model import Decision, Intent, Phase
from policies.base import Snapshot
from policies.baselines._common import (
    candidates,
    home_mask,
    jobs_in,
    masked_argmin,
    priced_offers,
    spot_mask,
)


@dataclass(frozen=True, slots=True)
class OnDemand:
    """Cheapest on-demand offer per unit of progress in the home region; never moves."""

    name = "on-demand"

    def __call__(self, snapshot: Snapshot) -> Decision:
        js = jobs_in(snapshot, Phase.WAITING)
        if len(js) == 0:
            return Decision()
        cols = priced_offers(snapshot, ~spot_mask(snapshot))
        cand = candidates(snapshot, snapshot.fit, js, cols)
        home = home_mask(snapshot, js, cols)
        best, usd = masked_argmin(cand.usd_per_gpu_h, cand.ok & home, cols)
        intents: dict[int, Intent] = {}
        for j, o, c in zip(js.tolist(), best.tolist(), usd.tolist(), strict=True):
            if o < 0:
                continue
            offer = snapshot.offers[o]
            intents[j] = Intent(
                o,
                f"on-demand in home region {offer.region}: {offer.id} at "
                f"{snapshot.usd_per_hour[o]:.2f} $/h, {c:.3f} $/GPU-h (cheapest there)",
            )
        return Decision(intents)
