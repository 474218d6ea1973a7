"""What carbon-year's spot hazard costs: heliotrope against the oracle with the hazard and
with every spot offer up throughout, beside the online optimum against the clairvoyant one
on the same jobs (orchestrator/replay/hazard_bound.py). Three windows at 0 USD/t.

Printed, with what must hold checked (never speed): heliotrope meets every deadline with and
without the hazard (the oracle, a capacity-aware schedule that re-plans after losing work to
hourly checkpoints, is not a bound here and may miss one), and per job the online optimum is
not below the clairvoyant mean (within four standard errors of that mean)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.replay.suites import run_suite
from orchestrator.replay.suites.hazard_jobs import carbon_year_bounds, window_rows

pytestmark = [pytest.mark.bench, pytest.mark.traces]

OPTIONS = {"windows": 3, "carbon_prices": "0"}


@pytest.mark.timeout(1800)  # two suite runs and 60 inductions: 7 min on 2 cores (measured)
def test_what_the_hazard_costs_heliotrope_and_the_online_optimum(shared_data: Path) -> None:
    ratios = {}
    for label, extra in (("spot hazard", {}), ("spot always up", {"spot_loss_per_hour": 0})):
        result = run_suite(
            "carbon-year", shared_data, ["heliotrope"], {**OPTIONS, **extra}, workers=2
        )
        row = result.policy("heliotrope")
        assert row.deadlines_met == row.jobs == 60
        assert row.regret is not None
        ratios[label] = 1 + row.regret
        print(
            f"\nheliotrope, {label}: J / J(oracle) {ratios[label]:.4f}, "
            f"worst window {row.worst_ratio:.4f} ({row.worst_window})"
        )
    bounds = carbon_year_bounds(shared_data, OPTIONS, workers=2)
    for b in bounds:
        assert b.bound.online_usd >= b.bound.clairvoyant_usd - 4 * b.bound.clairvoyant_se_usd, b
    print("online optimum / clairvoyant (the same jobs, the model of hazard_bound):")
    for row in window_rows(bounds):
        print(
            f"  {row['window']:>10}: {row['ratio']:.4f} over {row['jobs']} jobs, "
            f"worst {row['worst_job']}"
        )
    total = window_rows(bounds)[-1]["ratio"]
    print(
        f"the hazard costs heliotrope {ratios['spot hazard'] - ratios['spot always up']:+.3f} "
        f"of J / J(oracle); the online optimum pays {total - 1:+.3f} over the clairvoyant"
    )
