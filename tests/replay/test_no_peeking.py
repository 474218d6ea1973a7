"""No policy sees the future: a decision at tick k is identical when every signal row after
k is replaced by garbage (issue #3)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import numpy as np
import pytest

from orchestrator.clock import FakeClock
from orchestrator.jobs import parse_jobs
from orchestrator.loop import Controller, EventLog
from orchestrator.model import Decision
from orchestrator.replay.runner import build_grid
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.scenario import generate
from policies.base import Policy, Snapshot
from policies.registry import make_policy
from providers.sim import SimProvider

K = 200  # ticks of 10 minutes


class Recorder:
    """Wraps a policy and keeps every decision it made."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.name = policy.name
        self.decisions: list[Decision] = []

    def __call__(self, snapshot: Snapshot) -> Decision:
        decision = self.policy(snapshot)
        self.decisions.append(decision)
        return decision


def garbage_after(grid: SignalGrid, k: int, seed: int) -> SignalGrid:
    rng = np.random.default_rng(seed)
    fields = {}
    for name in ("usd_per_hour", "spot_capacity", "carbon_g_per_kwh", "carbon_marginal_g_per_kwh"):
        a = getattr(grid, name).copy()
        a[k + 1 :] = rng.uniform(-1e3, 1e6, a[k + 1 :].shape)
        a[k + 1 :][rng.random(a[k + 1 :].shape) < 0.2] = np.nan
        fields[name] = a
    curt = grid.curtailing.copy()
    curt[k + 1 :] = rng.random(curt[k + 1 :].shape) < 0.5
    return dataclasses.replace(grid, curtailing=curt, **fields)


def run(policy: Policy, grid: SignalGrid, jobs: tuple, ticks: int) -> Recorder:  # type: ignore[type-arg]
    recorder = Recorder(policy)
    clock = FakeClock(grid.start)
    controller = Controller(jobs, grid, SimProvider(grid, clock), recorder, EventLog())
    for k in range(ticks + 1):
        clock.set(grid.time_of(k))
        controller.tick(grid.time_of(k))
    return recorder


@pytest.mark.parametrize(
    "name",
    [
        "heliotrope",
        "uniform-progress",
        "spot-failover",
        "carbon-greedy",
        "curtailment-threshold",
        "on-demand",
    ],
)
def test_decisions_do_not_depend_on_the_future(name: str) -> None:
    trace = generate(5, 4)
    start = trace.prices["time"].min().to_pydatetime()
    jobs = parse_jobs(
        {
            "jobs": [
                {
                    "name": "a",
                    "work_gpu_hours": 200,
                    "gpus": 8,
                    "start_offset_h": 0,
                    "deadline_h": 60,
                    "home_region": "us-east-1",
                    "gpu_types": ["A100-40GB", "H100"],
                    "count": 3,
                },
                {
                    "name": "b",
                    "work_gpu_hours": 10,
                    "gpus": 1,
                    "start_offset_h": 2,
                    "deadline_h": 40,
                    "home_region": "us-central1",
                    "gpu_types": ["L4", "A100-80GB"],
                    "count": 3,
                },
            ]
        },
        trace_start=start,
    )
    grid = build_grid(trace, jobs, 600, seed=1)
    assert grid.n_ticks > K + 10
    clean = run(make_policy(name), grid, jobs, K)
    dirty = run(make_policy(name), garbage_after(grid, K, seed=2), jobs, K)
    assert len(clean.decisions) == len(dirty.decisions) == K + 1
    assert clean.decisions == dirty.decisions
    assert any(d.intents for d in clean.decisions)  # the policy did decide things
    assert start + timedelta(hours=K / 6) < max(j.deadline for j in jobs)
