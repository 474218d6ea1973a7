"""Replay speed: 100 jobs x 30 days at 10-minute ticks x 40 offers (issue #2).

Prints job-ticks per second (wall, and by the process's CPU time beside it, which leaves
out the time it waited for a core but not a neighbour's load on the caches) and peak
memory per policy, and each time as a ratio to the on-demand replay, to a reference
workload and to a workload of small numpy calls (what a fleet policy's tick is made of)
measured in the same run, the ticks the replay ran (it stops when the last job is
done, so a policy whose last job finishes later runs more of them for the same job-ticks)
and the time per tick, and a digest of every event and final fleet number: a speed-up must
leave each policy's digest as it was.
Target: >= 200,000 job-ticks/s on a 2-core machine. `HELIOTROPE_BENCH_POLICIES=a,b` picks
the policies (on-demand first gives the ratios their base).
"""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from orchestrator.loop import LoopOptions
from orchestrator.model import JobSpec
from orchestrator.replay.runner import PolicyRun, build_grid, run_policy
from orchestrator.signals.scenario import generate
from policies.registry import make_policy
from tests.benchmarks.conftest import (
    FLEET_POLICIES,
    best_wall_and_cpu,
    reference_workload_s,
    small_calls_workload_s,
)

pytestmark = pytest.mark.bench

T0 = datetime(2024, 4, 1, tzinfo=UTC)


def fleet(n: int, regions: list[str]) -> list[JobSpec]:
    rng = np.random.default_rng(7)
    jobs = []
    for i in range(n):
        start = T0 + timedelta(hours=float(rng.uniform(0, 48)))
        gpus = int(rng.choice([1, 8]))
        work = float(rng.uniform(20, 120)) * gpus
        jobs.append(
            JobSpec(
                id=f"job-{i:03d}",
                work_gpu_hours=work,
                gpus=gpus,
                start=start,
                deadline=start + timedelta(hours=float(rng.uniform(150, 600))),
                checkpoint_size_gb=float(rng.uniform(5, 200)),
                cold_start_h=0.1,
                home_region=regions[i % len(regions)],
                gpu_types=frozenset({"A100-80GB", "A100-40GB", "H100", "L4", "V100"}),
            )
        )
    # One long job holds the window open for the full 30 days.
    jobs[-1] = JobSpec(**{**_fields(jobs[-1]), "start": T0, "deadline": T0 + timedelta(days=30)})
    return jobs


def test_replay_job_ticks_per_second() -> None:
    trace = generate(0, 32)
    regions = sorted(set(trace.offers["region"]))
    jobs = fleet(100, regions)
    grid = build_grid(trace, jobs, 600, 0)
    # The first 40 offers, but the 30 days from T0 exactly.
    grid = grid.select(range(min(40, len(grid.offers))))
    home = {o.region for o in grid.offers}
    jobs = [
        j if j.home_region in home else JobSpec(**{**_fields(j), "home_region": sorted(home)[0]})
        for j in jobs
    ]
    n_ticks = min(grid.n_ticks, 30 * 144)
    grid = _truncate(grid, n_ticks)
    job_ticks = len(jobs) * n_ticks
    ref, small = reference_workload_s(), small_calls_workload_s()
    print(
        f"\nreplay: {len(jobs)} jobs x {n_ticks} ticks x {len(grid.offers)} offers "
        f"= {job_ticks:,} job-ticks; reference workload {ref:.3f} s, small numpy calls "
        f"{small:.3f} s"
    )
    base = None
    for name in bench_policies():
        policy = make_policy(name)
        seconds, cpu = best_wall_and_cpu(
            2, lambda p=policy: run_policy(p, jobs, grid, options=LoopOptions())
        )
        tracemalloc.start()
        run = run_policy(policy, jobs, grid, options=LoopOptions())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        base = base or seconds
        ran = len(run.times_s)  # the replay stops when the last job is done
        print(
            f"  {name:24s} {seconds:6.2f} s  {job_ticks / seconds:>10,.0f} job-ticks/s  "
            f"(CPU {cpu:5.2f} s, {job_ticks / cpu:>10,.0f})  "
            f"x{seconds / base:4.2f} of on-demand  x{seconds / ref:6.1f} of reference  "
            f"x{seconds / small:5.1f} of small calls  "
            f"{ran} ticks run, {1000 * seconds / ran:.2f} ms each  "
            f"peak {peak / 2**20:6.1f} MiB  decisions {placements_digest(run)}"
        )


def bench_policies() -> list[str]:
    """Every registered policy but the per-job planners, or `HELIOTROPE_BENCH_POLICIES`
    (a comma list) where set."""
    chosen = [p.strip() for p in os.environ.get("HELIOTROPE_BENCH_POLICIES", "").split(",")]
    if any(chosen):
        return [p for p in chosen if p]
    return list(FLEET_POLICIES)


def placements_digest(run: PolicyRun) -> str:
    """A short hash of every event (time, job, kind, offer, reason) and every final fleet
    array of a run: equal digests, equal decisions and figures."""
    h = hashlib.sha256()
    for e in run.events:
        h.update(repr((e.time_s, e.job_id, str(e.kind), e.offer_id, e.detail)).encode())
    for name in run.fleet.__dataclass_fields__:
        h.update(np.ascontiguousarray(getattr(run.fleet, name)).tobytes())
    return h.hexdigest()[:12]


def _fields(job: JobSpec) -> dict[str, object]:
    return {f: getattr(job, f) for f in job.__dataclass_fields__}


def _truncate(grid, n):  # type: ignore[no-untyped-def]
    import dataclasses

    return dataclasses.replace(
        grid,
        **{
            name: getattr(grid, name)[:n]
            for name in (
                "usd_per_hour",
                "spot_capacity",
                "carbon_g_per_kwh",
                "carbon_marginal_g_per_kwh",
                "carbon_hourly_known",
                "curtailing",
            )
        },
    )
