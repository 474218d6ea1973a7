"""How good are the carbon forecasts the sources publish? MAE beside the seasonal-naive rule.

`forecast_skill(samples)` takes a samples log (what `heliotrope signals poll` keeps in
``samples.parquet``: forecasts and observations, each with ``observed_at``) and scores, per
source, every published forecast against what the same source observed later, beside the
seasonal-naive rule of `orchestrator.signals.forecast` run at the same issue time on the
same target times:

- an issue is the set of forecast rows read at one ``observed_at`` (its issue time);
- the seasonal-naive forecast of an issue sees only observations read by then
  (``observed_at <= issue`` and ``time < issue``): no peeking; its grid is the forecast's own
  step (1 h for Electricity Maps, 5 min for WattTime), its period one day;
- a target counts where the published value, the seasonal-naive value and a later
  observation are all known (the same hours for both).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Final

import numpy as np
import pandas as pd

from orchestrator.signals.forecast import forecast
from orchestrator.signals.sources.base import FORECAST_SUFFIX
from orchestrator.signals.sources.tracemap import GRID_METRIC, forecast_rows

DAY: Final = timedelta(days=1)
HISTORY: Final = timedelta(days=7)


@dataclass(frozen=True, slots=True)
class Skill:
    """The scores of one source on one metric: `n` target times, `issues` issues."""

    source: str
    metric: str
    zones: tuple[str, ...]
    issues: int
    n: int
    mae_source: float
    mae_seasonal_naive: float

    @property
    def ratio(self) -> float:
        """The source's MAE over the seasonal-naive one (below 1: the source is better)."""
        return self.mae_source / self.mae_seasonal_naive if self.mae_seasonal_naive else np.nan


def _observations(samples: pd.DataFrame) -> pd.DataFrame:
    src = samples["source"].astype(str)
    obs = samples[~src.str.endswith(FORECAST_SUFFIX) & samples["value"].notna()]
    metric = [
        GRID_METRIC.get((str(k), str(u)), "") for k, u in zip(obs["kind"], obs["unit"], strict=True)
    ]
    obs = obs.assign(metric=metric, grid_zone=obs["key"].astype(str))
    obs = obs[obs["metric"] != ""]
    return obs.assign(
        time=pd.to_datetime(obs["time"], utc=True),
        observed_at=pd.to_datetime(obs["observed_at"], utc=True),
    )


def forecast_skill(
    samples: pd.DataFrame, *, history: timedelta = HISTORY, period: timedelta = DAY
) -> list[Skill]:
    """Per (source, metric): MAE of the published forecasts and of the seasonal-naive rule
    on the same target times (see the module docstring)."""
    if samples.empty:
        return []
    forecasts = forecast_rows(samples)
    obs = _observations(samples)
    out: list[Skill] = []
    for (source, metric), fc in forecasts.groupby(["source", "metric"], sort=True):
        errors_src: list[float] = []
        errors_naive: list[float] = []
        zones: set[str] = set()
        issues = 0
        for (zone, issued), rows in fc.groupby(["grid_zone", "issued_at"], sort=True):
            seen = obs[
                (obs["source"] == source) & (obs["grid_zone"] == zone) & (obs["metric"] == metric)
            ]
            got = _score_issue(rows, seen, pd.Timestamp(str(issued)), history, period)
            if got is None:
                continue
            e_src, e_naive = got
            errors_src.extend(e_src)
            errors_naive.extend(e_naive)
            zones.add(str(zone))
            issues += 1
        if errors_src:
            out.append(
                Skill(
                    str(source),
                    str(metric),
                    tuple(sorted(zones)),
                    issues,
                    len(errors_src),
                    float(np.mean(errors_src)),
                    float(np.mean(errors_naive)),
                )
            )
    return out


def _score_issue(
    rows: pd.DataFrame,
    seen: pd.DataFrame,
    issued: pd.Timestamp,
    history: timedelta,
    period: timedelta,
) -> tuple[list[float], list[float]] | None:
    targets = rows[rows["time"] >= issued].sort_values("time")
    if len(targets) < 1 or seen.empty:
        return None
    times = pd.DatetimeIndex(targets["time"])
    diffs = times.to_series().diff().dropna()
    step = diffs.median() if len(diffs) else pd.Timedelta(hours=1)
    if not step or step <= pd.Timedelta(0):
        return None
    first = times[0]
    # the history grid ends one step before the first target and starts `history` earlier
    last_hist = first - step
    n_hist = int(pd.Timedelta(history) / step)
    grid = pd.date_range(end=last_hist, periods=n_hist, freq=step)
    known = seen[(seen["observed_at"] <= issued) & (seen["time"] < issued)]
    if known.empty:
        return None
    past = (
        known.sort_values("observed_at", kind="stable")
        .drop_duplicates("time", keep="last")
        .set_index("time")["value"]
        .reindex(grid)
    )
    if past.notna().sum() == 0:
        return None
    periods = int(pd.Timedelta(period) / step)
    steps = ((times - last_hist) / step).astype(int)
    horizon = int(steps.max())
    naive = forecast(past.to_numpy(dtype=float)[:, None], horizon, periods, "seasonal_naive")
    naive_at = naive[steps.to_numpy() - 1, 0]
    truth = (
        seen.sort_values("observed_at", kind="stable")
        .drop_duplicates("time", keep="last")
        .set_index("time")["value"]
        .reindex(times)
        .to_numpy(dtype=float)
    )
    published = targets["value"].to_numpy(dtype=float)
    ok = np.isfinite(truth) & np.isfinite(published) & np.isfinite(naive_at)
    if not ok.any():
        return None
    return (list(np.abs(published[ok] - truth[ok])), list(np.abs(naive_at[ok] - truth[ok])))


__all__ = ["Skill", "forecast_skill"]
