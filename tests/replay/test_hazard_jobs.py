"""carbon-year's spot hazard as an option, and the online optimum against the clairvoyant one
on the suite's own jobs (`heliotrope bench bound`). On ../shared/data (skipped without it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli import main
from orchestrator.costs import JobOfferFit, move_matrices
from orchestrator.model import Market
from orchestrator.replay.suites import case_grid
from orchestrator.replay.suites.base import Suite
from orchestrator.replay.suites.carbon_year import carbon_year
from orchestrator.replay.suites.hazard_jobs import case_bounds, hazard_job

pytestmark = pytest.mark.traces

SMALL = {"windows": 1, "jobs_per_window": 3, "carbon_prices": "0"}


@pytest.fixture(scope="module")
def hazard(shared_data_module: Path) -> Suite:
    return carbon_year(shared_data_module, SMALL)


@pytest.fixture(scope="module")
def steady(shared_data_module: Path) -> Suite:
    return carbon_year(shared_data_module, {**SMALL, "spot_loss_per_hour": 0})


def test_spot_loss_rate_zero_keeps_every_spot_offer_up(hazard: Suite, steady: Suite) -> None:
    assert "spot lost at 0.1/h" in hazard.description
    assert "spot lost at 0/h" in steady.description
    grids = [case_grid(suite.cases[0]) for suite in (hazard, steady)]
    spot = np.array([o.market is Market.SPOT for o in grids[0].offers])
    assert 0.4 < float((grids[0].spot_capacity[:, spot] > 0).mean()) < 0.8  # up 60 % of the time
    assert (grids[1].spot_capacity[:, spot] > 0).all()


def test_each_job_gets_its_cheapest_offers_and_an_on_demand_that_finishes(
    hazard: Suite,
) -> None:
    case = hazard.cases[0]
    grid = case_grid(case)
    fit = JobOfferFit.build(case.jobs, grid.offers)
    moves = move_matrices(grid.offers, case.settings)
    for j, spec in enumerate(case.jobs):
        job = hazard_job(grid, case, fit, moves, j, 4)
        assert job.k == 4
        per_progress = job.spot_usd_per_h / job.spot_rate
        assert (np.diff(per_progress) >= 0).all()  # cheapest first
        assert job.work == spec.work_gpu_hours and job.cold_start_h == spec.cold_start_h
        assert job.od_rate * (job.ticks * job.tick_h - job.cold_start_h) >= job.work
        assert (np.diag(job.egress_usd) == 0).all() and (job.egress_usd >= 0).all()
        assert job.checkpoint_h == spec.checkpoint_interval_h > 0  # what a preemption loses
        assert hazard_job(grid, case, fit, moves, j, 4, continuous=True).checkpoint_h == 0.0


def test_at_a_carbon_price_each_offer_costs_its_emissions_too(shared_data_module: Path) -> None:
    # The same job at 0 and 200 USD/t: its cheapest spot and on-demand options dearer by the
    # carbon of their energy; the work and the deadline as they were.
    jobs = []
    for price in ("0", "200"):
        case = carbon_year(shared_data_module, {**SMALL, "carbon_prices": price}).cases[0]
        grid = case_grid(case)
        fit = JobOfferFit.build(case.jobs, grid.offers)
        jobs.append(hazard_job(grid, case, fit, move_matrices(grid.offers, case.settings), 0, 1))
    free, priced = jobs
    # Per unit of progress (the offers are picked by it; the pick may change with the price).
    assert priced.od_usd_per_h / priced.od_rate > free.od_usd_per_h / free.od_rate
    assert (priced.spot_usd_per_h / priced.spot_rate)[0] > (free.spot_usd_per_h / free.spot_rate)[0]
    assert (priced.work, priced.ticks) == (free.work, free.ticks)


def test_the_online_optimum_is_never_below_the_clairvoyant_and_equal_without_hazard(
    hazard: Suite, steady: Suite
) -> None:
    for b in case_bounds(hazard.cases[0], offers=3, samples=40):
        assert b.bound.online_usd >= b.bound.clairvoyant_usd - 4 * b.bound.clairvoyant_se_usd
    for b in case_bounds(steady.cases[0], offers=3, samples=5):
        assert b.bound.online_usd == pytest.approx(b.bound.clairvoyant_usd)
        assert b.bound.clairvoyant_se_usd == 0.0


def test_bench_bound_prints_the_windows(
    shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "bound", "--data", str(shared_data), "--windows", "1"]
    args += ["--jobs-per-window", "2", "--offers", "3", "--samples", "20", "--json"]
    assert main(args) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["window"] == "2023-05-08" and row["jobs"] == 2
    assert row["ratio"] == pytest.approx(row["online_usd"] / row["clairvoyant_usd"], abs=1e-3)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--offers", "9"), ("--samples", "0"), ("--workers", "0"), ("--carbon-price", "50,200")],
)
def test_bench_bound_refuses_bad_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    assert main(["bench", "bound", "--data", str(tmp_path), flag, value]) == 2
    assert flag in capsys.readouterr().err
