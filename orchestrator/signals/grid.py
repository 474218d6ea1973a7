"""Align a trace onto a tick grid: the matrices the loop reads every tick.

`SignalGrid.build(trace, start, end, tick_s)` turns the change logs and samples of a trace
into dense `[tick, offer]` arrays (as-of joins, max ages, yearly fallbacks) once, so that a
tick only slices a row. Spot capacity stays NaN where the trace knows nothing; replay fills
such gaps with a seeded hazard (`providers.sim.realize_spot`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from orchestrator import catalog
from orchestrator.clock import utc
from orchestrator.errors import InputError
from orchestrator.model import BoolArray, FloatArray, Market, Offer
from orchestrator.signals.traces import Trace

logger = logging.getLogger(__name__)

# Ember, Global Electricity Review 2024: world average 480 gCO2/kWh in 2023. Used only where
# a zone has neither an hourly nor a yearly figure; results count such energy separately.
WORLD_AVG_G_PER_KWH = 480.0


@dataclass(frozen=True, slots=True)
class SignalGrid:
    """Dense signals on ticks ``start + k * tick_s`` for k in range(n_ticks).

    Per-offer matrices have shape (n_ticks, n_offers). `carbon_known` is False where the
    intensity was filled from a yearly or world average.
    """

    start: datetime
    tick_s: int
    offers: tuple[Offer, ...]
    usd_per_hour: FloatArray
    spot_capacity: FloatArray
    carbon_g_per_kwh: FloatArray
    carbon_marginal_g_per_kwh: FloatArray
    carbon_hourly_known: BoolArray
    curtailing: BoolArray

    @property
    def n_ticks(self) -> int:
        return int(self.usd_per_hour.shape[0])

    @property
    def start_s(self) -> float:
        return self.start.timestamp()

    def time_of(self, k: int) -> datetime:
        return self.start + timedelta(seconds=k * self.tick_s)

    def tick_of(self, when: datetime) -> int:
        """Index of the tick at or after `when` (clipped to the grid)."""
        k = int(np.ceil((utc(when) - self.start).total_seconds() / self.tick_s))
        return min(max(k, 0), self.n_ticks)

    def select(self, keep: Sequence[int]) -> SignalGrid:
        """The same grid restricted to the offers at indices `keep`."""
        idx = np.asarray(keep, dtype=np.int64)
        return SignalGrid(
            start=self.start,
            tick_s=self.tick_s,
            offers=tuple(self.offers[i] for i in idx),
            usd_per_hour=self.usd_per_hour[:, idx],
            spot_capacity=self.spot_capacity[:, idx],
            carbon_g_per_kwh=self.carbon_g_per_kwh[:, idx],
            carbon_marginal_g_per_kwh=self.carbon_marginal_g_per_kwh[:, idx],
            carbon_hourly_known=self.carbon_hourly_known[:, idx],
            curtailing=self.curtailing[:, idx],
        )

    @staticmethod
    def build(
        trace: Trace,
        start: datetime,
        end: datetime,
        tick_s: int,
        *,
        keep_offer: Callable[[Offer], bool] | None = None,
    ) -> SignalGrid:
        start, end = utc(start), utc(end)
        if tick_s <= 0:
            raise InputError("", "tick_s", "a positive number of seconds", got=tick_s)
        if end <= start:
            raise InputError(
                "",
                "end",
                "a time after start",
                got=f"{start} .. {end}",
                fix="widen the replay window",
            )
        n = int(np.ceil((end - start).total_seconds() / tick_s))
        tick_ns = (
            pd.Timestamp(start).as_unit("ns").value + np.arange(n, dtype=np.int64) * tick_s * 10**9
        )
        offers = _offers(trace, keep_offer)
        if not offers:
            raise InputError(
                "offers.parquet",
                "",
                "at least one offer with a price",
                got="none",
                fix="check the trace directory and the jobs' GPU types",
            )
        price = _price_matrix(trace.prices, offers, tick_ns)
        # Drop offers never priced in the window: nothing can be bought there.
        priced = ~np.all(np.isnan(price), axis=0)
        offers = [o for o, p in zip(offers, priced, strict=True) if p]
        price = price[:, priced]
        if not offers:
            raise InputError(
                "prices.parquet",
                "",
                "prices inside the replay window",
                got=f"none between {start} and {end}",
                fix="pick a window the trace covers (see manifest.json start/end)",
            )
        capacity = _spot_matrix(trace.spot, offers, tick_ns)
        zones = sorted({o.grid_zone for o in offers})
        zone_col = np.array([zones.index(o.grid_zone) for o in offers], dtype=np.int64)
        metrics = {
            m: _grid_matrix(trace, m, zones, tick_ns)
            for m in (
                "carbon_avg_g_per_kwh",
                "carbon_avg_yearly_g_per_kwh",
                "carbon_marginal_g_per_kwh",
                "curtailment_mw",
                "power_price_usd_per_mwh",
            )
        }
        hourly = metrics["carbon_avg_g_per_kwh"]
        known = ~np.isnan(hourly)
        carbon = np.where(known, hourly, metrics["carbon_avg_yearly_g_per_kwh"])
        carbon = np.where(np.isnan(carbon), WORLD_AVG_G_PER_KWH, carbon)
        with np.errstate(invalid="ignore"):
            curtailing = (np.nan_to_num(metrics["curtailment_mw"]) > 0) | (
                np.nan_to_num(metrics["power_price_usd_per_mwh"], nan=1.0) < 0
            )
        return SignalGrid(
            start=start,
            tick_s=tick_s,
            offers=tuple(offers),
            usd_per_hour=price,
            spot_capacity=capacity,
            carbon_g_per_kwh=carbon[:, zone_col],
            carbon_marginal_g_per_kwh=metrics["carbon_marginal_g_per_kwh"][:, zone_col],
            carbon_hourly_known=known[:, zone_col],
            curtailing=curtailing[:, zone_col],
        )


def _offers(trace: Trace, keep: Callable[[Offer], bool] | None) -> list[Offer]:
    markets = trace.prices.groupby(["cloud", "instance_type"])["market"].agg(set).to_dict()
    out: list[Offer] = []
    table = trace.offers
    for cloud, region, zone, instance_type, gpu_type, gpu_count, grid_zone in zip(
        table["cloud"].tolist(),
        table["region"].tolist(),
        table["zone"].tolist(),
        table["instance_type"].tolist(),
        table["gpu_type"].tolist(),
        table["gpu_count"].tolist(),
        table["grid_zone"].tolist(),
        strict=True,
    ):
        zone_of_grid = grid_zone or (catalog.grid_zone(cloud, region) or "")
        power_kw = catalog.instance_power_kw(gpu_type, gpu_count)
        pue = catalog.pue(cloud)
        for market in (Market.ON_DEMAND, Market.SPOT):
            if market.value not in markets.get((cloud, instance_type), set()):
                continue
            offer = Offer(
                id=Offer.make_id(cloud, zone, instance_type, market),
                cloud=cloud,
                region=region,
                zone=zone,
                instance_type=instance_type,
                gpu_type=gpu_type,
                gpu_count=gpu_count,
                market=market,
                grid_zone=zone_of_grid or "unknown",
                power_kw=power_kw,
                pue=pue,
            )
            if keep is None or keep(offer):
                out.append(offer)
    return out


def _asof(
    times_ns: np.ndarray, values: np.ndarray, tick_ns: np.ndarray, max_age_ns: float = np.inf
) -> np.ndarray:
    """Value in force at each tick: the last sample at or before it, NaN if none or stale."""
    idx = np.searchsorted(times_ns, tick_ns, side="right") - 1
    out = np.full(tick_ns.shape, np.nan)
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    if np.isfinite(max_age_ns):
        stale = ok & ((tick_ns - times_ns[np.maximum(idx, 0)]) > max_age_ns)
        out[stale] = np.nan
    return out


def _series(
    frame: pd.DataFrame, keys: list[str], value: str
) -> dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]]:
    out: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}
    if frame.empty:
        return out
    frame = frame.sort_values("time", kind="stable")
    t_ns = frame["time"].dt.as_unit("ns").astype("int64").to_numpy()
    vals = frame[value].to_numpy(dtype=np.float64)
    codes = frame.groupby(keys, sort=False).ngroup().to_numpy()
    key_rows = frame[keys].drop_duplicates().itertuples(index=False)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(codes.max() + 2))
    for code, key in enumerate(key_rows):
        sel = order[bounds[code] : bounds[code + 1]]
        out[tuple(str(k) for k in key)] = (t_ns[sel], vals[sel])
    return out


def _price_matrix(prices: pd.DataFrame, offers: Sequence[Offer], tick_ns: np.ndarray) -> FloatArray:
    series = _series(prices, ["cloud", "region", "zone", "instance_type", "market"], "usd_per_hour")
    out = np.full((len(tick_ns), len(offers)), np.nan)
    for j, o in enumerate(offers):
        zonal = series.get((o.cloud, o.region, o.zone, o.instance_type, o.market.value))
        regional = series.get((o.cloud, o.region, "", o.instance_type, o.market.value))
        col = np.full(len(tick_ns), np.nan)
        if regional is not None:
            col = _asof(*regional, tick_ns)
        if zonal is not None:
            z = _asof(*zonal, tick_ns)
            col = np.where(np.isnan(z), col, z)
        out[:, j] = col
    return out


def _spot_matrix(spot: pd.DataFrame, offers: Sequence[Offer], tick_ns: np.ndarray) -> FloatArray:
    series = _series(spot, ["cloud", "zone", "instance_type"], "capacity")
    out = np.full((len(tick_ns), len(offers)), np.inf)
    for j, o in enumerate(offers):
        if o.market is not Market.SPOT:
            continue
        exact = series.get((o.cloud, o.zone, o.instance_type))
        anytype = series.get((o.cloud, o.zone, ""))
        col = np.full(len(tick_ns), np.nan)
        if anytype is not None:
            col = _asof(*anytype, tick_ns)
        if exact is not None:
            e = _asof(*exact, tick_ns)
            col = np.where(np.isnan(e), col, e)
        out[:, j] = col
    return out


def _grid_matrix(
    trace: Trace, metric: str, zones: Sequence[str], tick_ns: np.ndarray
) -> FloatArray:
    frame = trace.grid[trace.grid["metric"] == metric]
    series = _series(frame, ["grid_zone"], "value")
    max_age_ns = trace.max_age_s(metric) * 1e9
    out = np.full((len(tick_ns), len(zones)), np.nan)
    for j, z in enumerate(zones):
        s = series.get((z,))
        if s is not None:
            out[:, j] = _asof(*s, tick_ns, max_age_ns)
    return out
