"""Benchmarks run only under `make bench` (marker `bench`); they print, never assert speed."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from policies.registry import POLICY_NAMES

# Planned per job, by DP: the oracle, and heliotrope-lookahead (8 DPs at each relaunch
# after a preemption) have their own benchmark (tests/benchmarks/suites); the fleet
# benchmarks run the rest.
PER_JOB_PLANNERS = ("oracle", "heliotrope-lookahead")
FLEET_POLICIES = tuple(n for n in POLICY_NAMES if n not in PER_JOB_PLANNERS)


def reference_workload_s() -> float:
    """A fixed mix of numpy and interpreter work, timed now: the yardstick that turns
    timings on a shared, noisy machine into ratios."""
    rng = np.random.default_rng(0)
    a = rng.random((200, 200))
    t = time.perf_counter()
    for _ in range(40):
        a = np.sqrt(a @ a.T / 200.0)
    total = 0
    for i in range(100_000):
        total += i % 7
    return time.perf_counter() - t


def small_calls_workload_s() -> float:
    """About 30,000 numpy calls on arrays of 100 jobs x 40 offers, the stuff of a fleet
    policy's tick (element-wise arithmetic, masks, row minima and maxima), timed now, the
    best of 3. The matrix work of `reference_workload_s` measures another cost: one machine
    ran the replay 1.9x slower at the same reference. So the replay benchmark prints its
    times against both."""
    rng = np.random.default_rng(0)
    a, b = rng.random((100, 40)), rng.random((100, 40))
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(2_000):
            c = np.where(a > b, a * b, np.inf)
            m = c.min(axis=1)
            np.argmax(a - b, axis=1)
            d = np.maximum(a - m[:, None], 0.0) / (b + 1.0)
            d[~np.isfinite(c)] = 0.0
            (d > 0.5).any(axis=1)
        best = min(best, time.perf_counter() - t)
    return best


def best_of(n: int, fn: Callable[[], object]) -> float:
    return best_wall_and_cpu(n, fn)[0]


def best_wall_and_cpu(n: int, fn: Callable[[], object]) -> tuple[float, float]:
    """The best wall time and the best CPU time of this process (`time.process_time`) over
    `n` runs: the CPU time leaves out the time the process waited for a core, which wall
    time counts."""
    walls, cpus = [], []
    for _ in range(n):
        t, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    return min(walls), min(cpus)
