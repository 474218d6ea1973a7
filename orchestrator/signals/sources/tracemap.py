"""Samples (the frames sources return) -> rows of the trace tables (`traces.COLUMNS`).

- grid: units ``g_co2_per_kwh`` / ``g_co2_per_kwh_marginal`` / ``mw`` / ``usd_per_mwh`` of
  kinds carbon / curtailment / power_price become the metrics of `GRID_METRIC`, keyed by
  grid zone; where two sources sample the same zone, metric and time, the one earlier in
  `priority` wins;
- prices: ``usd_per_hour`` samples, keys `keys.price_key`;
- spot: ``instances`` samples as capacity; AWS placement scores as capacity 1 (score >= 7,
  "likely"), 0 (score <= 3) or NaN (in between: unknown);
- spot_signals (side table, `traces.SIDE_TABLES`): Spot Advisor ``interruption_pct_max`` and
  ``savings_pct`` per region and instance type, and the raw ``placement_score`` per zone,
  as change logs closed with NaN at valid_until;
- forecasts (side table): every ``-forecast`` sample of a grid unit, one row per issue
  (``issued_at`` = when it was read) and target time, the source without the suffix.
  WattTime's percentile index has no trace column (samples log and state store only);
- offers: candidates from the price keys (zone '' -> a region-level candidate), for
  `importers.offers.build_offers`.

Staleness is written into the trace, not left to readers: after a sample's ``valid_until``,
when no newer sample of the same series follows by then, a NaN row at ``valid_until`` makes
the value unknown from there (for a region-level price: not sold from then on). Of several
observations of one series at one time, the latest observation's value is kept, valid until
the latest of their ``valid_until``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pandas as pd

from orchestrator.signals.importers._common import empty_candidates
from orchestrator.signals.sources.base import FORECAST_SUFFIX
from orchestrator.signals.traces import (
    COLUMNS,
    MARKETS,
    SIDE_TABLES,
    SPOT_METRICS,
    empty_frame,
    empty_side_table,
)

GRID_METRIC: Final[Mapping[tuple[str, str], str]] = {
    ("carbon", "g_co2_per_kwh"): "carbon_avg_g_per_kwh",
    ("carbon", "g_co2_per_kwh_marginal"): "carbon_marginal_g_per_kwh",
    ("curtailment", "mw"): "curtailment_mw",
    ("power_price", "usd_per_mwh"): "power_price_usd_per_mwh",
}
PLACEMENT_LIKELY: Final = 7  # AWS: a score near 10 means a request is very likely to succeed
PLACEMENT_UNLIKELY: Final = 3


@dataclass
class TraceRows:
    prices: pd.DataFrame = field(default_factory=lambda: empty_frame("prices"))
    spot: pd.DataFrame = field(default_factory=lambda: empty_frame("spot"))
    grid: pd.DataFrame = field(default_factory=lambda: empty_frame("grid"))
    candidates: pd.DataFrame = field(default_factory=empty_candidates)
    forecasts: pd.DataFrame = field(default_factory=lambda: empty_side_table("forecasts"))
    spot_signals: pd.DataFrame = field(default_factory=lambda: empty_side_table("spot_signals"))


def _collapse_and_close(
    frame: pd.DataFrame, series: list[str], rank: pd.Series | None = None
) -> pd.DataFrame:
    """One row per (series, time) (best `rank`, then latest observation), then a NaN row at
    each valid_until that no newer sample of the series reaches."""
    if frame.empty:
        return frame
    f = frame.assign(_rank=0 if rank is None else rank.to_numpy())
    f = f.sort_values(
        [*series, "time", "_rank", "observed_at"],
        ascending=[True] * (len(series) + 2) + [False],
        kind="stable",
    )
    same = [*series, "time", "source"]
    f["valid_until"] = f.groupby(same, sort=False)["valid_until"].transform("max")
    f = f.drop_duplicates([*series, "time"], keep="first").reset_index(drop=True)
    nxt = f.groupby(series, sort=False)["time"].shift(-1)
    vu = f["valid_until"]
    close = vu.notna() & (vu > f["time"]) & (nxt.isna() | (vu < nxt))
    ends = f[close.to_numpy()].copy()
    ends["time"] = ends["valid_until"]
    ends["value"] = np.nan
    out = pd.concat([f, ends], ignore_index=True)
    return out.sort_values([*series, "time"], kind="stable").reset_index(drop=True)


def samples_to_rows(samples: pd.DataFrame, priority: Sequence[str] = ()) -> TraceRows:
    """The trace rows of a samples frame (columns of `base.FRAME_COLUMNS`)."""
    out = TraceRows()
    if samples.empty:
        return out
    out.forecasts = forecast_rows(samples)
    s = samples[~samples["source"].astype(str).str.endswith(FORECAST_SUFFIX)]
    s = s[s["time"].notna()].copy()
    for col in ("time", "observed_at", "valid_until"):
        s[col] = pd.to_datetime(s[col], utc=True)
    for col in ("kind", "unit", "key"):  # once here, not in each of the steps below
        s[col] = s[col].astype(str)
    _grid_rows(out, s, priority)
    _price_rows(out, s)
    _spot_rows(out, s)
    _risk_rows(out, s)
    return out


def _grid_rows(out: TraceRows, s: pd.DataFrame, priority: Sequence[str]) -> None:
    """Grid samples (`GRID_METRIC` kinds and units): where sources overlap, the first of
    `priority` wins."""
    metric = pd.Series(
        [GRID_METRIC.get((k, u), "") for k, u in zip(s["kind"], s["unit"], strict=True)],
        index=s.index,
        dtype="object",
    )
    g = s.assign(grid_zone=s["key"], metric=metric)[(metric != "").to_numpy()]
    if len(g):
        order = {name: i for i, name in enumerate(priority)}
        rank = g["source"].map(lambda x: order.get(str(x), len(order)))
        g = _collapse_and_close(g, ["grid_zone", "metric"], rank)
        out.grid = g[list(COLUMNS["grid"])].reset_index(drop=True)


def _price_rows(out: TraceRows, s: pd.DataFrame) -> None:
    """Price samples (keys cloud/region/zone/instance_type/market), and an offer candidate
    per priced (cloud, region, zone, instance type)."""
    p = s[(s["kind"] == "price") & (s["unit"] == "usd_per_hour")]
    if not len(p):
        return
    parts = p["key"].str.split("/", expand=True)
    if parts.shape[1] != 5:
        return
    p = p.assign(
        cloud=parts[0], region=parts[1], zone=parts[2], instance_type=parts[3], market=parts[4]
    )
    p = p[p["market"].isin(MARKETS) & (p["cloud"] != "") & (p["instance_type"] != "")]
    p = _collapse_and_close(p, ["cloud", "region", "zone", "instance_type", "market"])
    out.prices = p.rename(columns={"value": "usd_per_hour"})[list(COLUMNS["prices"])]
    cand = p.drop_duplicates(["cloud", "region", "zone", "instance_type"])
    out.candidates = pd.DataFrame(
        {
            "cloud": cand["cloud"].to_numpy(),
            "region": cand["region"].to_numpy(),
            "zone": np.where(cand["zone"] == "", cand["region"], cand["zone"]),
            "instance_type": cand["instance_type"].to_numpy(),
            "gpu_name": "",
            "gpu_count_hint": np.nan,
        }
    )


def _spot_rows(out: TraceRows, s: pd.DataFrame) -> None:
    """Spot capacity samples (instances, or a placement score mapped to 1 / 0 / unknown)."""
    kind, unit = s["kind"], s["unit"]
    sp = s[(kind == "spot_availability") & unit.isin(["instances", "placement_score"])].copy()
    if not len(sp):
        return
    score = sp["value"].to_numpy(dtype=float)
    placement = (sp["unit"] == "placement_score").to_numpy()
    mapped = np.where(
        score >= PLACEMENT_LIKELY, 1.0, np.where(score <= PLACEMENT_UNLIKELY, 0.0, np.nan)
    )
    sp["value"] = np.where(placement, mapped, score)
    parts = sp["key"].str.split("/", expand=True)
    if parts.shape[1] == 4:
        sp = sp.assign(cloud=parts[0], zone=parts[2], instance_type=parts[3])
        sp = sp[(sp["zone"] != "") & (sp["cloud"] != "")]
        sp = _collapse_and_close(sp, ["cloud", "zone", "instance_type"])
        out.spot = sp.rename(columns={"value": "capacity"})[list(COLUMNS["spot"])]


def _risk_rows(out: TraceRows, s: pd.DataFrame) -> None:
    """Spot risk samples (`SPOT_METRICS` units) into the spot_signals side table."""
    kind, unit = s["kind"], s["unit"]
    rk = s[(kind == "spot_availability") & unit.isin(list(SPOT_METRICS))]
    if not len(rk):
        return
    parts = rk["key"].str.split("/", expand=True)
    if parts.shape[1] == 4:
        rk = rk.assign(
            cloud=parts[0],
            region=parts[1],
            zone=parts[2],
            instance_type=parts[3],
            metric=rk["unit"],
        )
        rk = rk[(rk["cloud"] != "") & (rk["instance_type"] != "")]
        rk = _collapse_and_close(rk, ["cloud", "region", "zone", "instance_type", "metric"])
        out.spot_signals = rk[list(SIDE_TABLES["spot_signals"])].reset_index(drop=True)


def forecast_rows(samples: pd.DataFrame) -> pd.DataFrame:
    """The ``-forecast`` samples of grid units as rows of the forecasts side table: issued
    when read (``observed_at``), of each (source, zone, metric, time, issue) the last."""
    src = samples["source"].astype(str)
    f = samples[src.str.endswith(FORECAST_SUFFIX) & samples["time"].notna()]
    if f.empty:
        return empty_side_table("forecasts")
    metric = pd.Series(
        [GRID_METRIC.get((str(k), str(u)), "") for k, u in zip(f["kind"], f["unit"], strict=True)],
        index=f.index,
        dtype="object",
    )
    f = f[(metric != "").to_numpy()]
    if f.empty:
        return empty_side_table("forecasts")
    rows = pd.DataFrame(
        {
            "issued_at": pd.to_datetime(f["observed_at"], utc=True),
            "time": pd.to_datetime(f["time"], utc=True),
            "grid_zone": f["key"].astype(str),
            "metric": metric[f.index],
            "value": f["value"].astype(float),
            "source": f["source"].astype(str).str.removesuffix(FORECAST_SUFFIX),
        }
    )
    rows = rows.drop_duplicates(["source", "grid_zone", "metric", "time", "issued_at"], keep="last")
    return rows.sort_values(["issued_at", "time", "grid_zone"], kind="stable").reset_index(
        drop=True
    )
