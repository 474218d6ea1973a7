"""One decision for 1,000 jobs x 200 offers (issue #3 target: <= 100 ms), per policy, with
times as ratios to a reference workload measured in the same run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from orchestrator import catalog
from orchestrator.clock import FakeClock
from orchestrator.loop import Controller, EventLog
from orchestrator.model import JobSpec, Market, Offer
from orchestrator.signals.grid import SignalGrid
from policies.registry import make_policy
from providers.sim import SimProvider
from tests.benchmarks.conftest import FLEET_POLICIES, best_of, reference_workload_s

pytestmark = pytest.mark.bench
T0 = datetime(2024, 4, 1, tzinfo=UTC)


def synthetic_grid(n_offers: int, n_ticks: int, seed: int = 0) -> SignalGrid:
    rng = np.random.default_rng(seed)
    kinds = [
        ("A100-80GB", 1, "a2-ultragpu-1g"),
        ("H100", 8, "a3-highgpu-8g"),
        ("L4", 1, "g2-standard-4"),
    ]
    offers = []
    for k in range(n_offers):
        gpu, count, itype = kinds[k % 3]
        market = Market.SPOT if k % 2 else Market.ON_DEMAND
        zone = f"zone-{k // 6:02d}"
        offers.append(
            Offer(
                Offer.make_id("gcp", zone, itype, market),
                "gcp",
                f"region-{k // 12:02d}",
                zone,
                itype,
                gpu,
                count,
                market,
                f"Z{k // 12}",
                catalog.instance_power_kw(gpu, count),
                1.1,
            )
        )
    base = rng.uniform(2, 40, n_offers)
    spot = np.array([o.market is Market.SPOT for o in offers])
    price = np.where(spot, base * 0.3, base)[None, :] * rng.uniform(0.9, 1.1, (n_ticks, n_offers))
    cap = np.where(spot[None, :], rng.integers(0, 20, (n_ticks, n_offers)), np.inf).astype(float)
    carbon = rng.uniform(20, 700, (n_ticks, n_offers))
    return SignalGrid(
        T0,
        600,
        tuple(offers),
        price,
        cap,
        carbon,
        np.full_like(carbon, np.nan),
        np.ones_like(carbon, dtype=bool),
        rng.random((n_ticks, n_offers)) < 0.05,
    )


def test_one_decision_1000_jobs_200_offers() -> None:
    grid = synthetic_grid(200, 400)
    rng = np.random.default_rng(1)
    regions = sorted({o.region for o in grid.offers})
    jobs = [
        JobSpec(
            id=f"j{i}",
            work_gpu_hours=float(rng.uniform(10, 500)),
            gpus=int(rng.choice([1, 8])),
            start=T0,
            deadline=T0 + timedelta(hours=float(rng.uniform(48, 200))),
            checkpoint_size_gb=50.0,
            cold_start_h=0.1,
            home_region=regions[i % len(regions)],
        )
        for i in range(1000)
    ]
    ref = reference_workload_s()
    print(f"\ndecision: 1000 jobs x {len(grid.offers)} offers; reference workload {ref:.3f} s")
    for name in FLEET_POLICIES:
        policy = make_policy(name)
        clock = FakeClock(T0)
        controller = Controller(jobs, grid, SimProvider(grid, clock), policy, EventLog())
        for k in range(150):  # a realistic fleet: most jobs placed, some moving
            clock.set(grid.time_of(k))
            controller.tick(grid.time_of(k))
        now = grid.time_of(150)
        snapshot = controller._snapshot(now, now.timestamp(), controller.frame_at(now.timestamp()))
        seconds = best_of(5, lambda p=policy, s=snapshot: p(s))
        print(f"  {name:24s} {seconds * 1000:8.1f} ms  x{seconds / ref:6.3f} of reference")
