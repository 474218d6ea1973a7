"""Oracle speed: one job of 100 h of work with a 150 h deadline, 10-minute ticks (900), over
13 zones x (spot, on-demand) = 26 offers (target: <= 5 s on a 2-core machine).

Two cost settings: SkyNomad's (uniform 0.02 USD/GB egress, no transfer time: 3,000 progress
levels) and the catalog's (per-route egress and transfer times: three startup classes and a
3x finer progress grid). On the SkyNomad H100 trace (13 GCP zones) when ../shared/data is
there, and on a seeded synthetic world of the same shape always. Prints seconds and the
ratio to a reference workload measured in the same run; never asserts speed.
"""

from __future__ import annotations

import dataclasses
import functools
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.clock import FakeClock
from orchestrator.loop import Controller, EventLog, LoopOptions
from orchestrator.model import CostSettings, Decision
from orchestrator.replay.suites import SKYNOMAD_FILE, skynomad_h100
from orchestrator.signals.grid import SignalGrid
from policies.base import Snapshot
from policies.oracle import Hindsight, JobProblem, job_problem, plan_job
from providers.sim import SimProvider, realize_spot
from tests.benchmarks.conftest import best_of, reference_workload_s
from tests.conftest import shared_data_dir

pytestmark = pytest.mark.bench

TICK_S = 600.0
WORK_H, DEADLINE_H, COLD_H = 100.0, 150.0, 0.1
SKYNOMAD_COSTS = CostSettings(egress_usd_per_gb=0.02, transfer_time=False, bill_final_tick=True)
CATALOG_COSTS = CostSettings(bill_final_tick=True)


def synthetic_problem(transfer: bool, seed: int = 0) -> JobProblem:
    """13 regions on 3 continents, spot (Markov availability) and on-demand in each."""
    rng = np.random.default_rng(seed)
    n_loc, n_ticks = 13, int(DEADLINE_H * 3600 / TICK_S)
    location = np.repeat(np.arange(n_loc), 2)
    spot = np.tile([True, False], n_loc)
    od = rng.uniform(80.0, 110.0, n_loc)
    price = np.where(spot, np.repeat(od * rng.uniform(0.18, 0.25, n_loc), 2), np.repeat(od, 2))
    up = np.empty((n_ticks, 2 * n_loc), dtype=bool)
    state = rng.random(2 * n_loc) < 0.6
    for k in range(n_ticks):
        flip = rng.random(2 * n_loc) < np.where(state, 0.02, 0.04)
        state = state ^ flip
        up[k] = state
    short = spot[None, :] & ~up
    continent = np.array([0] * 6 + [1] * 4 + [2] * 3)
    same = continent[:, None] == continent[None, :]
    egress = np.where(same, 0.02, 0.08) * 50.0
    np.fill_diagonal(egress, 0.0)
    transfer_h = np.where(same, 50 * 8 / 5.0, 50 * 8 / 1.0) / 3600.0 if transfer else 0.0
    startup = COLD_H + np.where(np.eye(n_loc, dtype=bool), 0.0, transfer_h)
    return JobProblem(
        tick_s=TICK_S,
        deadline_s=DEADLINE_H * 3600,
        work_gpu_h=WORK_H,
        rate=np.ones(2 * n_loc),
        usd_per_hour=np.repeat(price[None, :], n_ticks, axis=0),
        kg_per_hour=np.full((n_ticks, 2 * n_loc), 4.0),
        usable=~short,
        preempted=short,
        location=location,
        egress_usd=np.vstack([egress, np.zeros(n_loc)]),
        startup_h=np.vstack([startup, np.full(n_loc, COLD_H)]),
        bill_final_tick=True,
    )


def skynomad_problem(data_dir: Path, settings: CostSettings) -> JobProblem:
    """The same job on the 13 zones of the SkyNomad H100 trace, through the loop's snapshot."""
    zones = sorted(set(pd.read_csv(data_dir / SKYNOMAD_FILE)["zone"]))
    case = skynomad_h100(data_dir, {"zones": zones, "start_ticks": [0]}).cases[0]
    job = dataclasses.replace(
        case.jobs[0],
        work_gpu_hours=WORK_H,
        cold_start_h=COLD_H,
        deadline=case.start + timedelta(hours=DEADLINE_H),
    )
    grid = realize_spot(SignalGrid.build(case.trace, case.start, job.deadline, 600), 0)
    seen: list[Snapshot] = []

    class Capture:
        name = "capture"

        def __call__(self, snapshot: Snapshot) -> Decision:
            seen.append(snapshot)
            return Decision()

    controller = Controller(
        [job],
        grid,
        SimProvider(grid, FakeClock(grid.start)),
        Capture(),
        EventLog(),
        LoopOptions(settings=settings),
    )
    controller.tick(grid.start)
    return job_problem(seen[0], 0, 0, Hindsight.of(grid))


def test_oracle_speed_one_150h_job_26_offers() -> None:
    ref = reference_workload_s()
    cases: list[tuple[str, JobProblem]] = [
        ("synthetic, SkyNomad costs", synthetic_problem(transfer=False)),
        ("synthetic, catalog-like costs", synthetic_problem(transfer=True)),
    ]
    data = shared_data_dir()
    if (data / SKYNOMAD_FILE).is_file():
        cases += [
            ("SkyNomad H100 13 zones, SkyNomad costs", skynomad_problem(data, SKYNOMAD_COSTS)),
            ("SkyNomad H100 13 zones, catalog costs", skynomad_problem(data, CATALOG_COSTS)),
        ]
    print(
        f"\noracle: {WORK_H:g} h of work, deadline {DEADLINE_H:g} h, 600 s ticks; "
        f"reference workload {ref:.3f} s"
    )
    for label, pb in cases:
        plan = plan_job(pb)
        seconds = best_of(2, functools.partial(plan_job, pb))
        print(
            f"  {label:42s} {pb.usable.shape[1]} offers, {plan.progress_levels:5d} levels"
            f"{'' if plan.exact else ' (rounded)'}: {seconds:6.2f} s  "
            f"x{seconds / ref:6.1f} of reference  J {plan.objective_usd:9.2f} USD"
        )
