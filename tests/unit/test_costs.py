"""The shared cost model (orchestrator.costs) and the unit helpers it relies on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from orchestrator import units
from orchestrator.costs import (
    carbon_usd,
    marginal_intensity,
    move_cost,
    move_matrices,
    objective_usd,
    per_gb,
)
from orchestrator.model import CostSettings, JobSpec, Location, Market, Offer

T0 = datetime(2024, 4, 1, tzinfo=UTC)


def _offer(cloud: str, region: str, zone: str, market: Market = Market.SPOT) -> Offer:
    return Offer(
        Offer.make_id(cloud, zone, "a2-ultragpu-1g", market),
        cloud,
        region,
        zone,
        "a2-ultragpu-1g",
        "A100-80GB",
        1,
        market,
        "Z",
        0.5,
        1.1,
    )


OFFERS = [
    _offer("gcp", "us-central1", "us-central1-a"),
    _offer("gcp", "us-central1", "us-central1-b"),
    _offer("gcp", "us-central1", "us-central1-a", Market.ON_DEMAND),
    _offer("gcp", "europe-west1", "europe-west1-c"),
    _offer("gcp", "asia-southeast1", "asia-southeast1-b"),
    _offer("aws", "us-east-1", "us-east-1a"),
]
JOB = JobSpec(
    id="j",
    work_gpu_hours=10.0,
    gpus=1,
    start=T0,
    deadline=T0 + timedelta(days=1),
    checkpoint_size_gb=40.0,
    cold_start_h=0.1,
    home_region="us-central1",
)


@pytest.mark.parametrize(
    "settings",
    [
        CostSettings(),
        CostSettings(egress_usd_per_gb=0.02, transfer_time=False),
        CostSettings(transfer_gbps=5.0),
    ],
    ids=["catalog", "flat egress, instant copies", "fixed bandwidth"],
)
def test_move_matrices_are_move_cost_for_every_pair(settings: CostSettings) -> None:
    egress, transfer = move_matrices(OFFERS, settings)
    for a, src in enumerate(OFFERS):
        for b, dst in enumerate(OFFERS):
            move = move_cost(JOB, src.location, dst.location, settings)
            assert egress[a, b] * JOB.checkpoint_size_gb == pytest.approx(move.egress_usd)
            assert transfer[a, b] * JOB.checkpoint_size_gb == pytest.approx(move.transfer_h)


def test_nothing_moves_within_a_region_and_something_does_across() -> None:
    settings = CostSettings()
    here, other_zone = OFFERS[0].location, OFFERS[1].location
    assert per_gb(here, other_zone, settings) == (0.0, 0.0)
    egress_pg, transfer_h_pg = per_gb(here, OFFERS[3].location, settings)
    assert egress_pg > 0 and transfer_h_pg > 0
    assert move_cost(JOB, None, OFFERS[3].location) == move_cost(JOB, here, here)


def test_a_fixed_bandwidth_sets_the_copy_time() -> None:
    move = move_cost(
        JOB,
        Location("gcp", "us-central1"),
        Location("gcp", "europe-west1"),
        CostSettings(transfer_gbps=8.0),
    )
    assert move.transfer_h == pytest.approx(40.0 / 3600.0)  # 40 GB at 1 GB/s


def test_objective_and_carbon_cost_agree_on_floats_and_arrays() -> None:
    usd, kg, price = np.array([10.0, 2.5]), np.array([3.0, 0.0]), np.array([200.0, 50.0])
    assert objective_usd(10.0, 3.0, 200.0) == pytest.approx(10.6)
    np.testing.assert_allclose(objective_usd(usd, kg, price), [10.6, 2.5])
    # 2 kWh at 500 g/kWh = 1 kg; at 100 USD/t that costs 0.10 USD, like the objective's term
    assert carbon_usd(2.0, 500.0, 100.0) == pytest.approx(0.1)
    kwh, g = np.array([2.0, 4.0]), np.array([500.0, 250.0])
    np.testing.assert_allclose(carbon_usd(kwh, g, 100.0), [0.1, 0.1])
    np.testing.assert_allclose(
        objective_usd(np.zeros(2), units.kg_co2(kwh, g), 100.0), carbon_usd(kwh, g, 100.0)
    )


def test_marginal_intensity_falls_back_to_the_average_except_while_curtailing() -> None:
    marginal = np.array([300.0, np.nan, np.nan])
    average = np.array([100.0, 200.0, 400.0])
    curtailing = np.array([True, False, True])
    np.testing.assert_array_equal(
        marginal_intensity(marginal, average, curtailing), [300.0, 200.0, 0.0]
    )


def test_tick_at_counts_a_tick_own_time_as_that_tick() -> None:
    start, tick = T0.timestamp(), 600.0
    assert units.tick_at(start, start, tick) == 0
    assert units.tick_at(start + 3 * tick, start, tick) == 3
    assert units.tick_at(start + 3 * tick - 1e-7, start, tick) == 3  # float rounding
    assert units.tick_at(start + 3 * tick - 1.0, start, tick) == 2
    assert units.tick_at(start - 1.0, start, tick) == -1


def test_unit_conversions_round_trip_on_floats_and_arrays() -> None:
    assert units.hours(5400.0) == 1.5
    assert units.seconds(1.5) == 5400.0
    np.testing.assert_array_equal(units.hours(np.array([3600.0, 900.0])), [1.0, 0.25])
    assert units.kg_co2(2.0, 500.0) == 1.0
