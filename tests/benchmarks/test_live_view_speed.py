"""The live signal row (`StoreSignalView.frame`) for 200 offers from a state store holding
30 days of polled samples for them, per tick, beside the policy's own decision time for
1,000 jobs in the same run (issue #12 target: the row costs no more than the decision, and
under 0.2 s). Warm: a continuous controller (it reads only what was observed since its last
frame). Cold: a one-shot tick (Airflow), which reads the whole lookback once.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from orchestrator.clock import FakeClock
from orchestrator.loop import Controller, EventLog
from orchestrator.model import JobSpec, Market, Offer, SignalKind
from orchestrator.signals.sources.keys import price_key, spot_key
from orchestrator.signals.view import StoreSignalView, list_priors
from orchestrator.state import MemoryStateStore, SignalSample, open_store
from policies.registry import make_policy
from providers.sim import SimProvider
from tests.benchmarks.conftest import best_of, reference_workload_s
from tests.benchmarks.test_decision_speed import synthetic_grid

pytestmark = pytest.mark.bench
T0 = datetime(2024, 4, 1, tzinfo=UTC)
DAYS = 30
TICK_S = 600
PG = os.environ.get("HELIOTROPE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


def samples(offers, days: int) -> list[SignalSample]:  # type: ignore[no-untyped-def]
    """Hourly prices and placement scores per offer and hourly carbon per zone, as the
    signals DAG would poll them."""
    rng = np.random.default_rng(0)
    out = []
    zones = sorted({o.grid_zone for o in offers})
    for h in range(days * 24):
        t = T0 + timedelta(hours=h)
        for o in offers:
            m = o.market.value
            out.append(
                SignalSample(
                    time=t,
                    key=price_key(o.cloud, o.region, o.zone, o.instance_type, m),
                    kind=SignalKind.PRICE,
                    value=float(rng.uniform(1, 30)),
                    unit="usd_per_hour",
                    source="bench",
                    observed_at=t,
                    valid_until=t + timedelta(hours=2),
                )
            )
            if o.market is Market.SPOT:
                out.append(
                    SignalSample(
                        time=t,
                        key=spot_key(o.cloud, o.region, o.zone, o.instance_type),
                        kind=SignalKind.SPOT_AVAILABILITY,
                        value=float(rng.integers(1, 11)),
                        unit="placement_score",
                        source="bench",
                        observed_at=t,
                    )
                )
        for z in zones:
            out.append(
                SignalSample(
                    time=t,
                    key=z,
                    kind=SignalKind.CARBON,
                    value=float(rng.uniform(20, 700)),
                    unit="g_co2_per_kwh",
                    source="bench",
                    observed_at=t,
                )
            )
    return out


def time_view(store: object, offers: tuple[Offer, ...], now_s: float) -> tuple[float, float]:
    """(cold, warm) seconds of one frame: a new view, and one that framed the tick before."""

    def view() -> StoreSignalView:
        return StoreSignalView(
            store,
            offers,
            tick_s=TICK_S,  # type: ignore[arg-type]
            priors=list_priors(offers, 4.0),
        )

    cold_s = best_of(2, lambda: view().frame(now_s))
    warm = view()
    warm.frame(now_s)
    step = iter(range(1, 1000))
    warm_s = best_of(5, lambda: warm.frame(now_s + TICK_S * next(step)))
    return cold_s, warm_s


def test_live_row_vs_decision() -> None:
    grid = synthetic_grid(200, 400)
    offers = grid.offers
    rows = samples(offers, DAYS)
    stores: dict[str, object] = {"memory": MemoryStateStore()}
    try:
        pg = open_store(PG)
        pg.append_samples(rows[:0])
        with pg.engine.begin() as conn:
            import sqlalchemy as sa

            conn.execute(sa.text("DELETE FROM signal_samples WHERE source = 'bench'"))
        stores["postgresql"] = pg
    except Exception as exc:  # no server here: memory only
        print(f"\n(PostgreSQL skipped: {type(exc).__name__})")
    for store in stores.values():
        store.append_samples(rows)  # type: ignore[attr-defined]

    rng = np.random.default_rng(1)
    regions = sorted({o.region for o in offers})
    jobs = [
        JobSpec(
            id=f"j{i}",
            work_gpu_hours=float(rng.uniform(10, 500)),
            gpus=1,
            start=T0,
            deadline=T0 + timedelta(hours=float(rng.uniform(48, 200))),
            checkpoint_size_gb=50.0,
            cold_start_h=0.1,
            home_region=regions[i % len(regions)],
        )
        for i in range(1000)
    ]
    now = T0 + timedelta(days=DAYS)
    policy = make_policy("heliotrope")
    clock = FakeClock(T0)
    controller = Controller(jobs, grid, SimProvider(grid, clock), policy, EventLog())
    for k in range(150):  # a realistic fleet: most jobs placed, some moving
        clock.set(grid.time_of(k))
        controller.tick(grid.time_of(k))
    frame0 = controller.frame_at(grid.time_of(150).timestamp())
    snapshot = controller._snapshot(grid.time_of(150), grid.time_of(150).timestamp(), frame0)
    decision_s = best_of(3, lambda: policy(snapshot))
    ref = reference_workload_s()
    print(
        f"\nlive signal row: {len(offers)} offers, {DAYS} days of samples ({len(rows):,}); "
        f"heliotrope decision for 1,000 jobs {decision_s * 1000:.1f} ms; reference "
        f"workload {ref:.3f} s"
    )
    for name, store in stores.items():
        cold_s, warm_s = time_view(store, offers, now.timestamp())
        print(
            f"  {name:10s} warm {warm_s * 1000:7.1f} ms ({warm_s / decision_s:5.2f}x the "
            f"decision)  cold {cold_s * 1000:8.1f} ms ({cold_s / decision_s:5.2f}x)  "
            f"x{warm_s / ref:.3f} of reference"
        )
    pg_store = stores.get("postgresql")
    if pg_store is not None:
        with pg_store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.execute(sa.text("DELETE FROM signal_samples WHERE source = 'bench'"))
