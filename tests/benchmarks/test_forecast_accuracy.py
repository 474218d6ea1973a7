"""Which carbon forecast to use (issue #3): mean absolute error of persistence, seasonal
naive and the level-corrected blend, 1-24 h ahead, on the real Electricity Maps hourly
traces of 2023 (16 zones). Prints MAE per method and its ratio to persistence.

And the forecasts the sources publish (issue #18): per source (Electricity Maps, WattTime)
the MAE of its forecasts beside the seasonal-naive rule issued at the same times, on the
same target times (`orchestrator.signals.sources.skill`). Real numbers need a samples log
polled over days: ``HELIOTROPE_FORECAST_SAMPLES=traces/live/samples.parquet make bench``;
without it the recorded test answers are scored (made-up values: a check of the pipeline,
not of the sources)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from orchestrator.signals.forecast import forecast
from orchestrator.signals.sources.skill import forecast_skill
from tests.conftest import shared_data_dir

pytestmark = pytest.mark.bench


def test_carbon_forecast_accuracy() -> None:
    path = shared_data_dir() / "carbon" / "electricitymaps_hourly_ci_16zones_2021_2024.csv.gz"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    frame = pd.read_csv(path, usecols=["datetime_utc", "zone_id", "ci_direct_gco2_per_kwh"])
    frame = frame[frame["datetime_utc"].str.startswith("2023")]
    wide = frame.pivot_table(
        index="datetime_utc", columns="zone_id", values="ci_direct_gco2_per_kwh"
    ).sort_index()
    values = wide.to_numpy(dtype=float)
    horizon, period = 24, 24
    errors: dict[str, list[float]] = {"persistence": [], "seasonal_naive": [], "blend": []}
    for origin in range(7 * 24, values.shape[0] - horizon, 6):
        past = values[origin - 7 * 24 : origin + 1]
        truth = values[origin + 1 : origin + 1 + horizon]
        for method, errs in errors.items():
            pred = forecast(past, horizon, period, method)  # type: ignore[arg-type]
            errs.append(float(np.nanmean(np.abs(pred - truth))))
    base = np.mean(errors["persistence"])
    print(
        f"\ncarbon forecast, 1-24 h ahead, {wide.shape[1]} zones, 2023, "
        f"{len(errors['blend'])} origins"
    )
    for method, errs in errors.items():
        mae = np.mean(errs)
        print(f"  {method:15s} MAE {mae:7.2f} gCO2/kWh  x{mae / base:5.3f} of persistence")


def test_published_forecasts_beside_seasonal_naive() -> None:
    given = os.environ.get("HELIOTROPE_FORECAST_SAMPLES", "")
    if given:
        from orchestrator.signals.poll import read_samples

        path = Path(given)
        samples = read_samples(path.parent if path.is_file() else path)
        what = f"samples log {path}"
    else:
        from tests.signals.forecast_samples import recorded_forecast_samples

        samples = recorded_forecast_samples()
        what = "recorded test answers (made-up values: checks the pipeline, not the sources)"
    skills = forecast_skill(samples)
    if not skills:
        pytest.skip(f"no forecast with a later observation in {what}")
    print(f"\npublished carbon forecasts vs seasonal naive, same issue times and hours, {what}")
    for s in skills:
        print(
            f"  {s.source:16s} {s.metric:27s} zones {','.join(s.zones):14s} "
            f"issues {s.issues:4d} n {s.n:6d}  MAE {s.mae_source:7.2f}  "
            f"seasonal naive {s.mae_seasonal_naive:7.2f}  x{s.ratio:5.3f}"
        )
