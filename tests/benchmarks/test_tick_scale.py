"""One live controller tick for 1,000 / 3,000 / 10,000 jobs x 200 offers, on PostgreSQL and
on SQLite (issue #8 target: <= 2 s at 10,000 jobs on PostgreSQL).

Each fleet is submitted to a fresh store and run for a few ticks first (most jobs placed,
some moving). Then two kinds of tick are timed, three of each, the median printed:

- cold: a controller that has nothing cached: it loads the fleet, builds the loop (the
  job x offer fit), decides, acts and commits. This is every tick of a one-shot runner (an
  Airflow task) and the first tick after taking over the fleet lock;
- warm: the leader's steady tick: a version check, the migrations, decide, act, commit.

The cold tick is split into load, build (load + fit: the reload), commit and the rest
(decide, act, migrations); growth is the ratio to the 1,000-job tick.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestrator.clock import FakeClock
from orchestrator.live.controller import LiveController
from orchestrator.loop import LoopOptions
from orchestrator.model import JobSpec
from orchestrator.signals.grid import SignalGrid
from orchestrator.state import open_store
from policies.registry import make_policy
from providers.sim import SimProvider
from tests.benchmarks.conftest import reference_workload_s
from tests.benchmarks.test_decision_speed import T0, synthetic_grid
from tests.scale.fleet import pg_schema, pg_unavailable

pytestmark = pytest.mark.bench

SIZES = (1000, 3000, 10_000)
WARMUP_TICKS = 6
TIMED = 3
TARGET_S = 2.0


def fleet(n: int, grid: SignalGrid) -> list[JobSpec]:
    rng = np.random.default_rng(1)
    regions = sorted({o.region for o in grid.offers})
    return [
        JobSpec(
            id=f"j{i:05d}",
            work_gpu_hours=float(rng.uniform(10, 500)),
            gpus=int(rng.choice([1, 8])),
            start=T0,
            deadline=T0 + timedelta(hours=float(rng.uniform(48, 200))),
            checkpoint_size_gb=50.0,
            cold_start_h=0.1,
            home_region=regions[i % len(regions)],
        )
        for i in range(n)
    ]


class Timed:
    """Wraps a bound method and adds up the seconds spent in it."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.seconds = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t


def measure(url: str, n: int, grid: SignalGrid) -> dict[str, float]:
    jobs = fleet(n, grid)
    clock = FakeClock(grid.start)
    store = open_store(url, clock=clock)
    provider = SimProvider(grid, clock, cluster="bench")

    def controller() -> LiveController:
        return LiveController(
            store=store,
            provider=provider,
            policy=make_policy("heliotrope"),
            grid=grid,
            clock=clock,
            store_uri=lambda o: f"memory://bench/{o.region}",
            options=LoopOptions(cluster="bench"),
        )

    try:
        store.submit(jobs)
        live = controller()
        k = 0
        for k in range(WARMUP_TICKS):
            clock.set(grid.time_of(k))
            live.tick()
        parts: dict[str, list[float]] = {p: [] for p in ("cold", "load", "build", "commit", "warm")}
        for _ in range(TIMED):
            k += 1
            clock.set(grid.time_of(k))
            live = controller()  # nothing cached: load, build, decide, act, commit
            load, commit = Timed(store.load), Timed(store.commit)
            sync = Timed(live._sync)
            store.load, store.commit, live._sync = load, commit, sync  # type: ignore[method-assign]
            t = time.perf_counter()
            live.tick()
            parts["cold"].append(time.perf_counter() - t)
            del store.load, store.commit  # back to the class's methods
            parts["load"].append(load.seconds)
            parts["build"].append(sync.seconds)
            parts["commit"].append(commit.seconds)
            k += 1
            clock.set(grid.time_of(k))
            t = time.perf_counter()
            live.tick()  # the same controller again: warm
            parts["warm"].append(time.perf_counter() - t)
        return {p: statistics.median(v) for p, v in parts.items()}
    finally:
        store.close()


@contextmanager
def database(kind: str, tmp_path: Path, n: int) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / f'tick-{n}.db'}"
    else:
        with pg_schema("heliotrope_bench") as url:
            yield url


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_tick_scale(kind: str, tmp_path: Path) -> None:
    if kind == "postgresql" and pg_unavailable():
        pytest.skip(pg_unavailable() or "")
    grid = synthetic_grid(200, 400)
    ref = reference_workload_s()
    print(
        f"\ncontroller tick on {kind}: jobs x {len(grid.offers)} offers, median of "
        f"{TIMED}; reference workload {ref:.3f} s"
    )
    print(
        f"  {'jobs':>6} {'cold s':>7} {'growth':>6} {'load':>6} {'reload':>6} "
        f"{'commit':>6} {'rest':>6} {'warm s':>7} {'growth':>6}"
    )
    first: dict[str, float] = {}
    for n in SIZES:
        with database(kind, tmp_path, n) as url:
            r = measure(url, n, grid)
        first = first or r
        rest = r["cold"] - r["build"] - r["commit"]
        verdict = ""
        if n == max(SIZES) and kind == "postgresql":
            verdict = "   target <= {:g} s: cold {}, warm {}".format(
                TARGET_S, *("met" if r[p] <= TARGET_S else "MISSED" for p in ("cold", "warm"))
            )
        print(
            f"  {n:>6} {r['cold']:7.3f} {r['cold'] / first['cold']:5.1f}x {r['load']:6.2f} "
            f"{r['build']:6.2f} {r['commit']:6.2f} {rest:6.2f} {r['warm']:7.3f} "
            f"{r['warm'] / first['warm']:5.1f}x{verdict}",
            flush=True,
        )
