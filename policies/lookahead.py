"""`heliotrope-lookahead`: heliotrope, with the exact per-job DP on sampled futures at the
decision points (issue 14, item 1: the short-horizon lookahead).

Between decision points it is heliotrope (`policies.heliotrope.Heliotrope`), decision for
decision. At a decision point, an idle job that must relaunch after a preemption (it has a
checkpoint or progress and holds no instance), it:

1. learns, per spot offer, the lengths of its completed runs of availability and of
   unavailability from the snapshot's history up to now (never after; the first run of the
   lookback counts as long as it was seen, the current one is the offer's state and age);
2. samples `lookahead_samples` futures of availability to the job's deadline: the current
   run's rest from the completed runs at least as long as its age (a run longer than every
   one seen lasts on geometrically, with a mean of its age), then runs and outages drawn
   from the offer's own lengths in turn (an offer without completed runs of a kind: a
   geometric length with the mean of the ticks it was seen so plus heliotrope's prior,
   `lifetime_prior_h` or `outage_prior_h`);
3. holds prices, carbon and curtailment at their present values (a persistence forecast,
   as `policies.oracle.Hindsight.persistent`) and solves the job's exact problem
   (`policies.oracle.job_problem` and `plan_job`, the oracle's DP, on a progress grid of at
   most `lookahead_levels` levels) on each future;
4. takes the first action of the plans (wait, or launch on offer X) that more than
   `lookahead_quorum` of the samples agree on, in place of heliotrope's, when it differs;
   heliotrope's safety net is never overridden.

`lookahead_rule="mean"` instead prices each candidate first action (wait a tick, launch
on X) on every future, the rest of that future planned exactly, and takes the least mean
J. Measured, not kept: after the first tick each plan knows its future, so waiting is
valued as if the wait would then be spent perfectly; the job waits on a flickering zone
until the safety net sends it to on-demand (skynomad-h100, ratio 1.2, 2000 GB, window
t311: 2.10x the oracle; the vote 1.02x).

The random draws are seeded from the snapshot (job id, now, `lookahead_seed`): the same
snapshot gives the same decision, as the policy contract asks.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from orchestrator import units
from orchestrator.model import BoolArray, Decision, FloatArray, Intent, Phase
from policies.base import Snapshot
from policies.heliotrope import Heliotrope
from policies.oracle import NO_OFFER, Hindsight, JobProblem, job_problem, plan_job

_SAFETY = "safety net"


@dataclass(frozen=True, slots=True)
class RunModel:
    """Per spot offer, what its history up to now says (lengths in ticks): completed runs
    of availability (`up_runs`) and of unavailability (`down_runs`), whether it is up now
    and for how long it has been in that state (`age`, this tick included), and the
    capacity it showed while up (`up_capacity`)."""

    up_runs: tuple[npt.NDArray[np.int64], ...]
    down_runs: tuple[npt.NDArray[np.int64], ...]
    up_now: BoolArray
    age: npt.NDArray[np.int64]
    up_capacity: FloatArray

    @staticmethod
    def learn(capacity: FloatArray) -> RunModel:
        """From `capacity` rows [time, offer], oldest first, the last row being now (> 0:
        available; 0 or NaN: not)."""
        cap = np.asarray(capacity, dtype=np.float64)
        up = np.greater(np.nan_to_num(cap, nan=0.0), 0.0)
        n_rows, n_o = up.shape
        ups: list[npt.NDArray[np.int64]] = []
        downs: list[npt.NDArray[np.int64]] = []
        age = np.zeros(n_o, dtype=np.int64)
        up_cap = np.full(n_o, np.inf)
        for o in range(n_o):
            col = up[:, o]
            change = np.flatnonzero(col[1:] != col[:-1]) + 1
            bounds = np.concatenate([[0], change, [n_rows]])
            lengths = np.diff(bounds)
            states = col[bounds[:-1]]
            age[o] = int(lengths[-1])
            # Runs seen to end: all but the last (ongoing). The first may be cut by the
            # lookback (it lasted at least that long): kept, a long run is worth knowing.
            inner = slice(0, len(lengths) - 1)
            ups.append(lengths[inner][states[inner]].astype(np.int64))
            downs.append(lengths[inner][~states[inner]].astype(np.int64))
            seen = cap[col, o]
            seen = seen[np.isfinite(seen)]
            if seen.size:
                up_cap[o] = float(seen.max())
        return RunModel(tuple(ups), tuple(downs), up[-1].copy(), age, up_cap)

    def sample(
        self,
        offer: int,
        n_ticks: int,
        rng: np.random.Generator,
        prior_ticks: tuple[float, float] = (1.0, 1.0),
    ) -> BoolArray:
        """One future of `offer`'s availability: rows 0 (now) .. n_ticks - 1. `prior_ticks`
        (a run, an outage) is the prior of a kind of run the offer was never seen to end."""
        out = np.empty(n_ticks, dtype=bool)
        state = bool(self.up_now[offer])
        age = int(self.age[offer])
        pools = {True: self.up_runs[offer], False: self.down_runs[offer]}
        seen_ticks = {s: int(pools[s].sum()) + (age if s == state else 0) for s in (True, False)}
        # The current run: at least `age` long (this tick is its age-th); rows 0..rest.
        longer = pools[state][pools[state] >= age]
        if longer.size:
            rest = int(longer[rng.integers(longer.size)]) - age
        else:
            rest = _geometric(rng, max(float(age), 1.0)) - 1
        i = min(n_ticks, rest + 1)
        out[:i] = state
        while i < n_ticks:
            state = not state
            pool = pools[state]
            if pool.size:
                length = int(pool[rng.integers(pool.size)])
            else:
                # Never seen to end a run of this kind: the mean of what it was seen to do.
                prior = prior_ticks[0] if state else prior_ticks[1]
                length = _geometric(rng, seen_ticks[state] + prior)
            out[i : i + length] = state
            i += length
        return out


def _geometric(rng: np.random.Generator, mean: float) -> int:
    """A length >= 1 with the given mean (geometric)."""
    if mean <= 1.0:
        return 1
    return int(rng.geometric(1.0 / mean))


@dataclass
class HeliotropeLookahead(Heliotrope):
    """Heliotrope, with the exact DP on `lookahead_samples` sampled futures of spot
    availability at decision points (module doc)."""

    name = "heliotrope-lookahead"
    lookahead_samples: int = 8
    # More than this share of the samples must agree on the first action to override.
    lookahead_quorum: float = 0.5
    lookahead_levels: int = 1024
    lookahead_lookback_h: float = 168.0
    lookahead_seed: int = 0
    # "mean": the first action of least mean J over the futures (each then planned
    # exactly); "vote": the first action most of the futures' exact plans take.
    lookahead_rule: str = "vote"
    # It decides its own waits; with heliotrope's wait where the checkpoint lies on as well,
    # skynomad-h100 at 4000 GB went from 1.081 to 1.268 (docs/policies.md).
    wait_at_checkpoint: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lookahead_samples < 0:
            raise ValueError(f"lookahead_samples must be >= 0, got {self.lookahead_samples}")
        if not 0.0 <= self.lookahead_quorum < 1.0:
            raise ValueError(f"lookahead_quorum must be in [0, 1), got {self.lookahead_quorum}")
        if self.lookahead_rule not in ("mean", "vote"):
            raise ValueError(
                f"lookahead_rule must be 'mean' or 'vote', got {self.lookahead_rule!r}"
            )
        if self.lookahead_levels < 16:
            raise ValueError(f"lookahead_levels must be >= 16, got {self.lookahead_levels}")

    def __call__(self, snapshot: Snapshot) -> Decision:
        base = super().__call__(snapshot)
        if self.lookahead_samples == 0 or snapshot.history is None or not snapshot.offers:
            return base
        fleet = snapshot.fleet
        intents: dict[int, Intent] = dict(base.intents)
        idle = (
            (fleet.phase == Phase.WAITING)
            & (fleet.offer < 0)
            & ((fleet.checkpoint_offer >= 0) | (fleet.progress_gpu_h > 0))
        )
        points = [int(j) for j in np.flatnonzero(idle) if not _is_safety(intents.get(int(j)))]
        if not points:
            return base
        model = self._run_model(snapshot)
        changed = False
        for j in points:
            intent = intents.get(j)
            theirs = -1 if intent is None or intent.offer is None else intent.offer
            problems = self._futures(snapshot, j, model)
            votes = self._votes(problems)
            (top, n), *_ = votes.most_common(1)
            if self.lookahead_rule == "mean":
                q = self._expected(problems, sorted({-1, theirs, *votes}))
                ours = min(q, key=lambda a: (q[a], a != theirs))
                if ours == theirs or not q[ours] < q[theirs]:
                    continue
                why = f"lookahead: expected J {q[ours]:.2f} vs {q[theirs]:.2f} USD"
            else:
                ours = top
                if ours == theirs or n <= self.lookahead_quorum * self.lookahead_samples:
                    continue
                why = f"lookahead: {n}/{self.lookahead_samples} sampled futures"
            changed = True
            if ours < 0:
                intents.pop(j, None)  # it holds nothing: waiting is keeping that
            else:
                intents[j] = Intent(ours, f"{snapshot.offers[ours].id}: {why}")
        return Decision(intents) if changed else base

    def _futures(self, snapshot: Snapshot, j: int, model: RunModel) -> list[JobProblem]:
        """Job `j`'s exact problem on each of `lookahead_samples` sampled futures."""
        job = snapshot.jobs[j]
        tick_s = units.seconds(snapshot.tick_h)
        n_ticks = max(1, math.ceil((job.deadline.timestamp() - snapshot.now_s) / tick_s) + 1)
        seed = zlib.crc32(f"{job.id}|{snapshot.now_s:.3f}|{self.lookahead_seed}".encode())
        rng = np.random.default_rng(seed)
        spot = self._spot_mask(snapshot)
        cols = np.arange(len(snapshot.offers), dtype=np.int64)
        fixed = self._present(snapshot, n_ticks)
        prior = (self.lifetime_prior_h / snapshot.tick_h, self.outage_prior_h / snapshot.tick_h)
        problems = []
        for _ in range(self.lookahead_samples):
            capacity = np.full((n_ticks, len(snapshot.offers)), np.inf)
            for o in np.flatnonzero(spot).tolist():
                capacity[:, o] = np.where(
                    model.sample(o, n_ticks, rng, prior), model.up_capacity[o], 0.0
                )
            future = Hindsight(spot_capacity=capacity, **fixed)
            problems.append(job_problem(snapshot, j, 0, future, cols))
        return problems

    def _votes(self, problems: list[JobProblem]) -> Counter[int]:
        """First action (-1: hold nothing, else the offer launched) of the exact plan of
        each sampled future."""
        votes: Counter[int] = Counter()
        for problem in problems:
            plan = plan_job(problem, max_levels=self.lookahead_levels)
            votes[int(plan.target[0]) if len(plan.target) else -1] += 1
        return votes

    def _expected(self, problems: list[JobProblem], actions: list[int]) -> dict[int, float]:
        """Mean over the futures of J when the job takes `action` now (-1: waits a tick,
        else launches there) and follows that future's optimal plan afterwards; a missed
        deadline counts `_MISS` USD more."""
        return {a: float(np.mean([self._q(pb, a) for pb in problems])) for a in actions}

    def _q(self, pb: JobProblem, action: int) -> float:
        """J of taking `action` at boundary 0 of `pb`, then the optimal plan."""
        tick_s = pb.tick_s
        tick_h = units.hours(tick_s)
        if action < 0:
            usable = pb.usable.copy()
            usable[0] = False
            return _value(replace(pb, usable=usable), self.lookahead_levels)
        if not pb.usable[0, action]:
            return math.inf
        ckpt = pb.start_location if pb.start_location >= 0 else pb.n_locations
        dst = int(pb.location[action])
        startup = float(pb.startup_h[ckpt, dst]) / tick_h  # in ticks
        n = max(1, math.ceil(startup - 1e-9))
        jrate = np.nan_to_num(pb.objective_per_hour()[:, action])
        cost = float(pb.egress_usd[ckpt, dst])
        held = pb.usable[:n, action]
        if not held.all():  # preempted during its cold start: idle at `dst` from there
            i = int(np.argmin(held))
            cost += float(jrate[:i].sum()) * tick_h
            return cost + _value(
                _after(pb, i, start_offer=NO_OFFER, start_location=dst), self.lookahead_levels
            )
        cost += float(jrate[:n].sum()) * tick_h
        done = float(pb.rate[action]) * min(1.0, max(0.0, n - startup)) * tick_h
        if done >= pb.work_gpu_h:
            return cost
        rest = _after(pb, n, start_offer=action, start_location=-1, done_gpu_h=done)
        return cost + _value(rest, self.lookahead_levels)

    def _present(self, snapshot: Snapshot, n_ticks: int) -> dict[str, Any]:
        """The signals of now held for `n_ticks` rows (all but spot capacity)."""

        def rows(a: Any) -> Any:
            return np.broadcast_to(np.asarray(a)[None, :], (n_ticks, len(snapshot.offers)))

        return {
            "start_s": snapshot.now_s,
            "tick_s": units.seconds(snapshot.tick_h),
            "offers": tuple(snapshot.offers),
            "usd_per_hour": rows(snapshot.usd_per_hour),
            "carbon_g_per_kwh": rows(snapshot.carbon_g_per_kwh),
            "carbon_marginal_g_per_kwh": rows(snapshot.carbon_marginal_g_per_kwh),
            "curtailing": rows(snapshot.curtailing),
        }

    def _run_model(self, snapshot: Snapshot) -> RunModel:
        assert snapshot.history is not None
        lookback = max(2, int(self.lookahead_lookback_h / snapshot.tick_h))
        return RunModel.learn(snapshot.history.spot_capacity(lookback))


_MISS = 1e6  # USD added to a plan that misses its deadline (a hard constraint)


def _value(pb: JobProblem, levels: int) -> float:
    """J of `pb`'s optimal plan (`_MISS` more when it cannot meet the deadline)."""
    if pb.n_ticks == 0:
        return math.inf
    plan = plan_job(pb, max_levels=levels)
    return plan.objective_usd + (0.0 if plan.meets_deadline else _MISS)


def _after(
    pb: JobProblem, n: int, *, start_offer: int, start_location: int, done_gpu_h: float = 0.0
) -> JobProblem:
    """`pb` from its boundary `n` on, `done_gpu_h` of work done by then."""
    return replace(
        pb,
        deadline_s=pb.deadline_s - n * pb.tick_s,
        work_gpu_h=max(0.0, pb.work_gpu_h - done_gpu_h),
        usd_per_hour=pb.usd_per_hour[n:],
        kg_per_hour=pb.kg_per_hour[n:],
        usable=pb.usable[n:],
        preempted=pb.preempted[n:],
        start_offer=start_offer,
        start_location=start_location,
    )


def _is_safety(intent: Intent | None) -> bool:
    return intent is not None and intent.reason.startswith(_SAFETY)
