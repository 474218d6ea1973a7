"""`uniform-progress`: Can't Be Late's Uniform Progress policy, single region.

Source: Z. Wu, W.-L. Chiang, Z. Mao, Z. Yang, E. Friedman, S. Shenker, I. Stoica, "Can't Be
Late: Optimizing Spot Instance Savings under Deadlines", NSDI'24, §5.2 (Uniform Progress:
rules 1 uniform progress, 2 taking risks, 3 hysteresis) with the Safety Net rule on top. The
paper's setting is one region and one instance type; here the region is the job's home
region. The paper's safety net (when idle and R(t) < C(t) + 2d) is replaced by the check in
rule 1 below, made in every state.

Notation for job j at time t: W = `work_gpu_hours`, p = `progress_gpu_h`, d = `cold_start_h`,
the uniform line ``p*(t) = W * (t - start) / (deadline - start)`` (clipped to [0, W]).
Candidates are offers in the home region, priced, allowed for the job and able to take its
instances now. `spot` = the cheapest such spot offer per unit of progress; `od` = the cheapest
such on-demand offer per unit of progress; `od_fast` = the fastest such on-demand offer
(highest `rate`, ties: cheapest), with rate r_fast.

Rule, exactly, for every job that has started and is not DONE, in this order:
1. Safety net: if ``(deadline - t) - d <= (W - p) / r_fast + safety_margin_ticks * tick_h``
   (always true when no on-demand offer is priced), the job must be on on-demand: it stays
   if it holds an on-demand instance at least as fast as r_fast, else it goes to `od_fast`.
   It never leaves on-demand while this holds (the check is made every tick, first).
   (With no priced on-demand offer at all, a waiting job takes `spot` if there is one.)
2. On spot (STARTING or RUNNING): stay (a preemption makes it WAITING).
3. Hysteresis, on on-demand: stay until ``p >= p*(t + hysteresis_cold_starts * d)`` -- the
   paper's ``cp(t) >= ep(t + 2d)``: ahead of the line by 2d hours along it, i.e. by
   ``2d * W / (deadline - start)`` GPU-hours; then go to `spot` if there is one, else pause
   (the paper's state machine goes from on-demand to idle when ahead and spot is gone).
4. WAITING: launch `spot` if there is one; else, if behind the line (p < p*(t)), launch `od`;
   else keep waiting.

Why the safety net is sound: the slack ``(deadline - t) - d - (W - p) / r_fast`` falls by at
most one tick per tick (time passes, progress never goes back unless a preemption loses
unsaved work), so the first tick it is <= `tick_h` it is still >= 0, and a cold start of d
followed by (W - p) / r_fast hours of on-demand finishes by the deadline. A job whose slack
is >= 0 when it starts therefore never misses its deadline, provided on-demand capacity is
there (it is inf) and preemptions lose no work (checkpoints at preemption notice); work a
preemption throws away comes on top and is the residual risk, as in the paper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.costs import JobOfferFit
from orchestrator.model import BoolArray, Decision, FloatArray, IntArray, Intent, Offer, Phase
from orchestrator.units import SECONDS_PER_HOUR
from policies.base import Snapshot
from policies.baselines._common import (
    SubFit,
    candidates,
    held_offer,
    home_mask,
    job_facts,
    jobs_in,
    masked_argmin,
    priced_offers,
    spot_mask,
    take,
)

_KEEP = -2
_PAUSE = -1


@dataclass(frozen=True, slots=True)
class UniformProgress:
    """Spot when available, on-demand to stay on the uniform line, hysteresis, safety net."""

    hysteresis_cold_starts: float = 2.0
    safety_margin_ticks: float = 1.0
    name = "uniform-progress"
    _memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __call__(self, snapshot: Snapshot) -> Decision:
        js = jobs_in(snapshot, Phase.WAITING, Phase.STARTING, Phase.RUNNING)
        n_offers = len(snapshot.offers)
        if len(js) == 0 or n_offers == 0:
            return Decision()
        fleet = snapshot.fleet
        fit = snapshot.fit
        block = self._block(snapshot, js)
        spot, cols = block.spot, block.cols
        cand = candidates(snapshot, fit, js, cols, block.sub)
        ok = cand.ok & block.home
        is_spot = block.is_spot
        spot_best, _ = masked_argmin(cand.usd_per_gpu_h, ok & is_spot, cols)
        od_ok = ok & ~is_spot
        od_best, _ = masked_argmin(cand.usd_per_gpu_h, od_ok, cols)
        od_rate = np.where(od_ok, cand.rate, 0.0)
        r_fast = od_rate.max(axis=1) if len(cols) else np.zeros(len(js))
        fast_best, _ = masked_argmin(
            cand.usd_per_gpu_h, od_ok & (od_rate == r_fast[:, None]) & (od_rate > 0), cols
        )

        cur = held_offer(snapshot, js)
        holding = cur >= 0
        cur_spot = holding & spot[np.maximum(cur, 0)]
        cur_od = holding & ~cur_spot
        rate_now = take(fit.rate, js, cur, 0.0)

        work, cold_h, start_s, deadline_s = block.facts
        progress = fleet.progress_gpu_h[js]
        remaining = np.maximum(work - progress, 0.0)
        later_s = snapshot.now_s + self.hysteresis_cold_starts * cold_h * SECONDS_PER_HOUR
        with np.errstate(divide="ignore", invalid="ignore"):
            need_h = np.where(remaining > 0, remaining / r_fast, 0.0)
            span_s = deadline_s - start_s
            frac = np.where(span_s > 0, (snapshot.now_s - start_s) / span_s, 1.0)
            frac_later = np.where(span_s > 0, (later_s - start_s) / span_s, 1.0)
        left_h = (deadline_s - snapshot.now_s) / SECONDS_PER_HOUR
        slack_h = left_h - cold_h - need_h
        net = slack_h <= self.safety_margin_ticks * snapshot.tick_h
        line = work * np.clip(frac, 0.0, 1.0)
        line_later = work * np.clip(frac_later, 0.0, 1.0)
        lead = progress - line

        target = np.full(len(js), _KEEP, dtype=np.int64)
        on_fast_od = cur_od & (rate_now >= r_fast)
        to_fast = net & ~on_fast_od & (fast_best >= 0)
        target[to_fast] = fast_best[to_fast]
        free = ~net
        back = free & cur_od & (progress >= line_later)
        target[back] = np.where(spot_best[back] >= 0, spot_best[back], _PAUSE)
        waiting = free & ~holding
        # With no priced on-demand offer the safety net cannot act; a waiting job takes spot.
        to_spot = (waiting | (net & ~holding & (fast_best < 0))) & (spot_best >= 0)
        target[to_spot] = spot_best[to_spot]
        to_od = waiting & (spot_best < 0) & (lead < 0) & (od_best >= 0)
        target[to_od] = od_best[to_od]

        intents: dict[int, Intent] = {}
        acting = np.flatnonzero(target != _KEEP)
        margin_h = self.safety_margin_ticks * snapshot.tick_h
        # The acting rows as Python numbers: the reasons are formatted per job.
        for j, o, fast, was_back, spot_now, p, ln, ln_later, slack in zip(
            js[acting].tolist(),
            target[acting].tolist(),
            to_fast[acting].tolist(),
            back[acting].tolist(),
            to_spot[acting].tolist(),
            progress[acting].tolist(),
            line[acting].tolist(),
            line_later[acting].tolist(),
            slack_h[acting].tolist(),
            strict=True,
        ):
            numbers = f"progress {p:.2f} vs line {ln:.2f} GPU-h, slack {slack:.2f} h"
            if fast:
                why = f"safety net (slack <= {margin_h:.2f} h)"
            elif was_back:
                why = (
                    f"on-demand ahead of the line {self.hysteresis_cold_starts:g}d later "
                    f"({ln_later:.2f} GPU-h)"
                )
                why += ", spot available" if o >= 0 else ", no spot: pause"
            elif spot_now:
                why = "spot available"
            else:
                why = "behind the line, no spot"
            where = f"{snapshot.offers[o].id}: " if o >= 0 else ""
            intents[j] = Intent(o if o >= 0 else None, f"{where}{why}; {numbers}")
        return Decision(intents)

    def _block(self, snapshot: Snapshot, js: IntArray) -> _HomeBlock:
        """The static facts of this call's jobs on the priced offers of their home regions,
        kept while the jobs, the offers and which of them are priced stay the same."""
        priced = np.isfinite(snapshot.usd_per_hour)
        key = (js.tobytes(), priced.tobytes())
        memo: _HomeBlock | None = self._memo.get("block")
        if (
            memo is not None
            and memo.fit is snapshot.fit
            and memo.offers is snapshot.offers
            and memo.key == key
        ):
            return memo
        spot = spot_mask(snapshot)
        cols = priced_offers(snapshot, np.ones(len(snapshot.offers), dtype=np.bool_))
        home = home_mask(snapshot, js, cols)
        in_some_home = home.any(axis=0)
        cols, home = cols[in_some_home], home[:, in_some_home]
        block = _HomeBlock(
            fit=snapshot.fit,
            offers=snapshot.offers,
            key=key,
            spot=spot,
            cols=cols,
            home=home,
            is_spot=spot[cols][None, :],
            sub=SubFit.of(snapshot.fit, js, cols),
            facts=job_facts(snapshot, js).T,
        )
        self._memo["block"] = block
        return block


@dataclass(frozen=True, slots=True)
class _HomeBlock:
    fit: JobOfferFit
    offers: Sequence[Offer]
    key: tuple[bytes, bytes]
    spot: BoolArray  # per offer
    cols: IntArray  # priced offers in some job's home region
    home: BoolArray  # [job, col]
    is_spot: BoolArray  # [1, col]
    sub: SubFit
    facts: FloatArray  # [4, job]: work, cold start, start, deadline
