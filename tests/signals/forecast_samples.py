"""A samples log of two polls a day apart, built from recorded answers with the real
parsers: Electricity Maps (DE) and WattTime (CAISO_NORTH) forecasts issued at the first poll
and the observations both polls read. Values are made up (tests/signals/recorded/README.md):
what the forecast benchmark prints on them shows the pipeline, not a source's skill."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd

from orchestrator.model import SignalKind
from orchestrator.signals.sources.base import Obs, concat_frames, make_frame
from orchestrator.signals.sources.carbon import (
    parse_em_forecast,
    parse_em_history,
    parse_wt_moer,
)
from tests.signals.server import recorded

ISSUE = datetime(2024, 3, 30, 4, tzinfo=UTC)  # the first poll: forecasts issued
LATER = ISSUE + timedelta(days=1)  # the second poll: what happened


def _frame(rows: list[Obs], observed_at: datetime) -> pd.DataFrame:
    return make_frame(rows, SignalKind.CARBON, observed_at)


def recorded_forecast_samples() -> pd.DataFrame:
    em_before = parse_em_history(recorded("em_history_DE_20240330.json"), "DE")
    em_forecast = parse_em_forecast(recorded("em_forecast_DE_20240330.json"), "DE")
    em_after = parse_em_history(recorded("em_history_DE.json"), "DE")
    wt_all = parse_wt_moer(
        recorded("wt_historical_20240329_31.json"), "US-CAL-CISO", forecast=False
    )
    wt_forecast = parse_wt_moer(recorded("wt_forecast_20240330.json"), "US-CAL-CISO", forecast=True)
    return concat_frames(
        [
            _frame(em_before + em_forecast, ISSUE),
            _frame(em_after, LATER),
            _frame([o for o in wt_all if o.time < ISSUE] + wt_forecast, ISSUE),
            _frame([o for o in wt_all if o.time >= ISSUE], LATER),
        ]
    )
