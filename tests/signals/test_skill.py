"""forecast_skill: published forecasts against what the source observed later, beside the
seasonal-naive rule issued at the same time (no peeking)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from orchestrator.signals.sources.skill import forecast_skill
from tests.signals.forecast_samples import ISSUE, recorded_forecast_samples
from tests.signals.server import recorded


def _em_expected() -> tuple[float, float, int]:
    """Electricity Maps' scores computed straight from the recordings."""
    before = json.loads(recorded("em_history_DE_20240330.json"))["history"]
    after = json.loads(recorded("em_history_DE.json"))["history"]
    fc = json.loads(recorded("em_forecast_DE_20240330.json"))["forecast"]
    src, naive = [], []
    for b, a, f in zip(before, after, fc, strict=True):
        if a["carbonIntensity"] is None:  # no observation: the hour does not count
            continue
        src.append(abs(f["carbonIntensity"] - a["carbonIntensity"]))
        naive.append(abs(b["carbonIntensity"] - a["carbonIntensity"]))
    return float(np.mean(src)), float(np.mean(naive)), len(src)


def test_scores_per_source_on_the_same_hours() -> None:
    skills = {s.source: s for s in forecast_skill(recorded_forecast_samples())}
    assert set(skills) == {"electricitymaps", "watttime"}
    em = skills["electricitymaps"]
    mae_src, mae_naive, n = _em_expected()
    assert (em.n, em.issues, em.zones) == (n, 1, ("DE",)) and n == 23
    assert em.mae_source == pytest.approx(mae_src)
    assert em.mae_seasonal_naive == pytest.approx(mae_naive)
    wt = skills["watttime"]
    assert wt.metric == "carbon_marginal_g_per_kwh" and wt.n == 288  # 5-minute steps
    assert wt.ratio < 1.0  # the recorded WattTime forecast tracks the day-over-day drift


def test_the_naive_rule_never_sees_what_was_read_after_the_issue() -> None:
    samples = recorded_forecast_samples()
    base = {s.source: s for s in forecast_skill(samples)}["electricitymaps"]
    # an observation of the day before, corrected and read only after the issue
    late = samples[
        (samples["source"] == "electricitymaps")
        & (samples["time"] == pd.Timestamp(ISSUE) - pd.Timedelta(hours=24))
    ].copy()
    late["value"] = late["value"] + 1000.0
    late["observed_at"] = pd.Timestamp(ISSUE) + pd.Timedelta(hours=2)
    again = {s.source: s for s in forecast_skill(pd.concat([samples, late]))}
    assert again["electricitymaps"].mae_seasonal_naive == base.mae_seasonal_naive
    # read by the issue time (a re-read at the issue itself), it is what the rule uses
    late["observed_at"] = pd.Timestamp(ISSUE)
    peeked = {s.source: s for s in forecast_skill(pd.concat([samples, late]))}
    assert peeked["electricitymaps"].mae_seasonal_naive > base.mae_seasonal_naive


def test_nothing_to_score() -> None:
    samples = recorded_forecast_samples()
    assert forecast_skill(samples[~samples["source"].str.endswith("-forecast")]) == []
    assert forecast_skill(samples.iloc[0:0]) == []
    assert math.isfinite(forecast_skill(samples)[0].ratio)
