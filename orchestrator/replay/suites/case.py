"""One case of a suite: its realized grid, every policy through the replay service, and the
window's totals per policy with regret against the oracle."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from orchestrator import units
from orchestrator.costs import JobOfferFit, objective_usd
from orchestrator.loop import LoopOptions
from orchestrator.model import EventKind, JobSpec, Phase
from orchestrator.replay.runner import PolicyRun
from orchestrator.replay.service import run_policies
from orchestrator.replay.suites.base import ORACLE, SuiteCase
from orchestrator.replay.suites.results import WindowResult
from orchestrator.signals.grid import SignalGrid
from policies.base import Policy
from policies.oracle import Hindsight, Oracle
from policies.registry import make_policy
from providers.sim import realize_spot


def run_case(
    case: SuiteCase,
    names: Sequence[str],
    oracle_levels: int = 16384,
    step: Callable[[str, int], None] | None = None,
) -> list[WindowResult]:
    """Every policy of `names` (the oracle among them) on one case, regret against the
    oracle's J on the case; `step(label, k)` as policy k starts."""
    grid = case_grid(case)
    options = LoopOptions(cluster="bench", settings=case.settings)
    index = {n: k for k, n in enumerate(names)}

    def started(policy: str, done: int, total: int) -> None:
        if step is not None and done == 0:
            step(f"{case.setting} {case.window} {policy}", index[policy])

    policies = [case_policy(n, case, grid, oracle_levels) for n in names]
    runs = run_policies(policies, case.jobs, grid, options=options, progress=started)
    rows = {n: window_result(case, grid, n, run) for n, run in zip(names, runs, strict=True)}
    trivial = any(
        n == ORACLE and single_stays(run, case.jobs, grid)
        for n, run in zip(names, runs, strict=True)
    )
    oracle = rows.get(ORACLE)
    base = oracle.objective_usd if oracle is not None else math.nan
    return [
        dataclasses.replace(
            r, regret=r.objective_usd / base - 1.0 if base > 0 else None, trivial=trivial
        )
        for r in (rows[n] for n in names)
    ]


def window_result(case: SuiteCase, grid: SignalGrid, name: str, run: PolicyRun) -> WindowResult:
    """One policy's totals on one case (the finishing tick left out where the case drops
    it), regret not yet known."""
    f = run.fleet
    deadlines = np.array([j.deadline.timestamp() for j in case.jobs])
    finished = f.phase == Phase.DONE
    met = finished & (f.finished_at_s <= deadlines + 1e-6)
    usd, kg = float(f.usd.sum()), float(f.kg_co2.sum())
    last_usd = last_kg = 0.0
    if case.drop_finishing_tick:
        last_usd, last_kg = finishing_tick(run, case.jobs, grid)
    usd, kg = usd - last_usd, kg - last_kg
    return WindowResult(
        setting=case.setting,
        window=case.window,
        policy=name,
        jobs=len(case.jobs),
        usd=usd,
        kg_co2=kg,
        finishing_tick_usd=last_usd,
        objective_usd=objective_usd(usd, kg, case.settings.carbon_usd_per_tonne),
        deadlines_met=int(met.sum()),
        finished=int(finished.sum()),
        preemptions=int(f.preemptions.sum()),
        migrations=int(f.migrations.sum()),
        launches=int(f.launches.sum()),
        regret=None,
    )


def single_stays(run: PolicyRun, jobs: Sequence[JobSpec], grid: SignalGrid) -> bool:
    """Whether every job ran as one uninterrupted stay from its first tick: launched once,
    at once, never preempted."""
    launches: dict[str, list[float]] = {}
    for e in run.events:
        if e.kind is EventKind.PREEMPTED:
            return False
        if e.kind is EventKind.LAUNCHED:
            launches.setdefault(e.job_id, []).append(e.time_s)
    return all(
        len(launches.get(j.id, [])) == 1
        and launches[j.id][0] <= max(j.start.timestamp(), grid.start_s) + grid.tick_s + 1e-6
        for j in jobs
    )


def case_policy(name: str, case: SuiteCase, grid: SignalGrid, oracle_levels: int) -> Policy:
    """The policy `name`; the oracle bound to the case's grid, billing and level bound."""
    if name == ORACLE:
        return Oracle(
            hindsight=Hindsight.of(grid),
            drop_finishing_tick=case.drop_finishing_tick,
            max_progress_levels=oracle_levels,
        )
    return make_policy(name)


def case_grid(case: SuiteCase) -> SignalGrid:
    """The realized world of one case (spot gaps filled with the replay's seeded hazard, at
    the case's rate of loss)."""
    grid = SignalGrid.build(
        case.trace,
        case.start,
        case.end,
        case.tick_s,
        keep_offer=lambda o: any(j.allows(o.gpu_type) for j in case.jobs),
    )
    return realize_spot(grid, 0, loss_per_hour=case.spot_loss_per_hour)


def finishing_tick(
    run: PolicyRun, jobs: Sequence[JobSpec], grid: SignalGrid
) -> tuple[float, float]:
    """Dollars and kgCO2 billed in the ticks in which `run`'s jobs finished (whole ticks:
    run with ``bill_final_tick``): what SkyNomad's reported numbers leave out."""
    fit = JobOfferFit.build(jobs, grid.offers)
    index = {j.id: i for i, j in enumerate(jobs)}
    offer_ix = {o.id: k for k, o in enumerate(grid.offers)}
    usd = kg = 0.0
    tick_h = units.hours(grid.tick_s)
    for e in run.events:
        if e.kind is not EventKind.FINISHED:
            continue
        j, o = index[e.job_id], offer_ix[e.offer_id]
        k = min(
            grid.n_ticks - 1, max(0, math.ceil((e.time_s - grid.start_s) / grid.tick_s - 1e-9) - 1)
        )
        usd += float(grid.usd_per_hour[k, o]) * float(fit.instances[j, o]) * tick_h
        kwh = units.kwh(float(fit.power_kw[j, o]), float(fit.pue[o]), tick_h)
        kg += units.kg_co2(kwh, float(grid.carbon_g_per_kwh[k, o]))
    return usd, kg
