"""Forecasts: exact on what they model, sane on what they don't."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.signals.forecast import forecast, forecast_mean

P = 24


def daily(n: int, level: float = 300.0) -> np.ndarray:
    t = np.arange(n)
    return (level + 100 * np.sin(2 * np.pi * t / P))[:, None]


@pytest.mark.parametrize("method", ["seasonal_naive", "blend"])
def test_a_pure_daily_cycle_is_forecast_exactly(method: str) -> None:
    past = daily(3 * P)
    future = daily(3 * P + 30)[3 * P :]
    assert forecast(past, 30, P, method) == pytest.approx(future)  # type: ignore[arg-type]


def test_blend_follows_a_level_shift_within_the_day() -> None:
    # Two days at level 300, then six hours at 400: blend shifts yesterday's shape by the
    # jump, seasonal naive repeats yesterday.
    shifted = np.vstack([daily(2 * P), daily(P, level=400.0)[:6]])
    truth = daily(P, level=400.0)[6:12]
    assert forecast(shifted, 6, P, "blend") == pytest.approx(truth)
    assert forecast(shifted, 6, P, "seasonal_naive") == pytest.approx(truth - 100.0)


def test_short_history_falls_back_to_persistence() -> None:
    assert forecast(np.array([[5.0], [7.0]]), 3, P).ravel().tolist() == [7.0, 7.0, 7.0]


def test_gaps_are_carried_forward_and_never_negative() -> None:
    past = daily(2 * P)
    past[-5:] = np.nan
    out = forecast(past, 10, P)
    assert np.isfinite(out).all() and (out >= 0).all()


def test_mean_includes_the_current_value() -> None:
    past = np.array([[1.0], [1.0], [4.0]])
    assert forecast_mean(past, 2, P, "persistence") == pytest.approx([4.0])
    assert forecast_mean(past, 1, P) == pytest.approx([4.0])
