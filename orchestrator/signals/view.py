"""The policy's signals as one small interface, `SignalView`, with two implementations.

    frame = view.frame(now_s)        # SignalFrame: a grid whose row `frame.k` is "now"
    frame.grid.usd_per_hour[frame.k] # per offer; rows before k are the history

- `GridView`: a precomputed `SignalGrid` (replay, tests, the demo's scenario). Past the end
  of its grid the frame is stale: the controller holds instead of deciding on the last row.
- `StoreSignalView`: the live view. Each frame is built from the signal samples in the
  state store (what `heliotrope signals poll` and the signals DAG wrote, and what the
  controller observed itself: refused launches, preemptions), as known at `now`: a sample
  counts from when it was both valid (`time`) and seen (`observed_at`), for at most its
  series' max age after it was observed, and never past its `valid_until`. Where no sample
  counts, the documented prior is used (list price, assumed spot capacity, the zone's
  yearly carbon average) and the frame's `basis` says so. History rows at `now - i * tick_s`
  are computed by the same rule, so a one-shot tick (Airflow) and a continuous controller
  see the same rows, and a replay of the polled samples (`grid_from_samples`) sees them too.

The loop and the policies never know which view they read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeAlias

import numpy as np

from orchestrator import catalog, units
from orchestrator.model import FloatArray, Market, Offer, SignalKind
from orchestrator.signals.grid import WORLD_AVG_G_PER_KWH, SignalGrid
from orchestrator.signals.sources.base import FORECAST_SUFFIX
from orchestrator.signals.sources.keys import price_key, spot_key
from orchestrator.signals.sources.tracemap import PLACEMENT_LIKELY, PLACEMENT_UNLIKELY
from orchestrator.state.records import SignalSample

if TYPE_CHECKING:
    import pandas as pd

#: The source name of what the controller observes itself (a refused spot launch, a
#: preemption): written to the store as spot-availability samples, read back here.
OBSERVED_SOURCE: Final = "heliotrope-observed"
# How far back a live frame's rows reach (the world's `lookback_h` default), and so how much
# history before its window a replay of polled samples gives the policy.
DEFAULT_LOOKBACK_S: Final = 7 * 86400.0

#: The signals of a frame, each with its own max age (seconds after observation).
SIGNALS: Final = ("price", "capacity", "carbon", "carbon_marginal", "curtailment", "power_price")

#: Where two sources give one signal, the earlier wins (others follow, by name).
SOURCE_PRIORITY: Final[Mapping[str, tuple[str, ...]]] = {
    "capacity": (OBSERVED_SOURCE, "aws-placement-score"),
    "carbon": ("electricitymaps", "uk-carbon", "eia930", "watttime"),
    "carbon_marginal": ("watttime", "electricitymaps"),
}

# (kind, unit) of a sample -> the signal it feeds (other units stay in the samples log).
_SIGNAL_OF: Final[Mapping[tuple[str, str], str]] = {
    ("price", "usd_per_hour"): "price",
    ("spot_availability", "instances"): "capacity",
    ("spot_availability", "placement_score"): "capacity",
    ("carbon", "g_co2_per_kwh"): "carbon",
    ("carbon", "g_co2_per_kwh_marginal"): "carbon_marginal",
    ("curtailment", "mw"): "curtailment",
    ("power_price", "usd_per_mwh"): "power_price",
}


@dataclass(frozen=True, slots=True)
class MaxAges:
    """How long after it was observed a sample still counts, per signal (seconds)."""

    price_s: float = 6 * 3600.0
    capacity_s: float = 2 * 3600.0
    carbon_s: float = 2 * 3600.0
    curtailment_s: float = 2 * 3600.0

    def of(self, signal: str) -> float:
        if signal == "price":
            return self.price_s
        if signal == "capacity":
            return self.capacity_s
        if signal in ("carbon", "carbon_marginal"):
            return self.carbon_s
        return self.curtailment_s

    @property
    def longest_s(self) -> float:
        return max(self.price_s, self.capacity_s, self.carbon_s, self.curtailment_s)


@dataclass(frozen=True, slots=True)
class Priors:
    """What a frame assumes where no sample counts: per offer the list price (USD/h) and the
    spot capacity assumed obtainable (NaN: unknown, which policies treat as none); per grid
    zone its yearly average carbon (g/kWh; missing: the world average)."""

    usd_per_hour: FloatArray
    spot_capacity: FloatArray
    yearly_g_per_kwh: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SignalBasis:
    """What the row of `now` was made of, per offer and signal: the source (or "prior:
    ..."), and the age of the sample in seconds (NaN for a prior)."""

    source: Mapping[str, tuple[str, ...]]
    age_s: Mapping[str, FloatArray]

    def describe(self, o: int, signal: str) -> str:
        src = self.source[signal][o]
        age = float(self.age_s[signal][o])
        if math.isnan(age):
            return src
        return f"{src}, {_age_words(age)} old"

    def fallbacks(self) -> list[str]:
        """Signals that fell back to their prior for some offer: ``carbon (3 of 8)``."""
        out = []
        for signal, sources in self.source.items():
            n = sum(s.startswith("prior") for s in sources)
            if n:
                out.append(f"{signal} ({n} of {len(sources)})")
        return out


@dataclass(frozen=True, slots=True)
class SignalFrame:
    """The signals at one instant: `grid` row `k` is now, rows before it the history.
    `stale` says why nothing should be decided on them (empty: they are fine)."""

    grid: SignalGrid
    k: int
    stale: tuple[str, ...] = ()
    basis: SignalBasis | None = None


class SignalView(Protocol):
    @property
    def offers(self) -> tuple[Offer, ...]: ...

    @property
    def tick_s(self) -> int: ...

    def frame(self, now_s: float) -> SignalFrame:
        """The signals in force at `now_s`, with history up to it."""
        ...


def as_view(signals: SignalView | SignalGrid) -> SignalView:
    return GridView(signals) if isinstance(signals, SignalGrid) else signals


class GridView:
    """A precomputed grid as a view. Its frames are the grid itself at the tick of `now`."""

    def __init__(self, grid: SignalGrid) -> None:
        self.grid = grid
        for name in (
            "usd_per_hour",
            "spot_capacity",
            "carbon_g_per_kwh",
            "carbon_marginal_g_per_kwh",
            "curtailing",
            "carbon_hourly_known",
        ):
            getattr(grid, name).flags.writeable = False

    @property
    def offers(self) -> tuple[Offer, ...]:
        return self.grid.offers

    @property
    def tick_s(self) -> int:
        return self.grid.tick_s

    def frame(self, now_s: float) -> SignalFrame:
        g = self.grid
        k = units.tick_at(now_s, g.start_s, g.tick_s)
        stale: tuple[str, ...] = ()
        if k >= g.n_ticks:
            end = g.time_of(g.n_ticks)
            stale = (
                f"signals are stale: they end at {end:%Y-%m-%d %H:%M} UTC (a "
                "scenario: extend `days` in config.yaml)",
            )
        return SignalFrame(g, min(max(k, 0), g.n_ticks - 1), stale)


def list_priors(
    offers: Sequence[Offer], spot_capacity: float, quotes: Mapping[str, float] | None = None
) -> Priors:
    """Priors for a world's offers: the quoted or catalog on-demand list price; for spot,
    the quote, else the list price less the low end of the cloud's published discount range
    (`scenario.SPOT_DISCOUNT`: a conservative guess, never the cheapest); the assumed spot
    capacity; each zone's yearly carbon (the scenario's Electricity Maps 2024 figures)."""
    from orchestrator.signals.scenario import GRID_ZONES, SPOT_DISCOUNT

    usd = np.full(len(offers), math.nan)
    for i, o in enumerate(offers):
        quoted = (quotes or {}).get(o.id)
        listed = catalog.on_demand_usd_per_hour(o.cloud, o.instance_type)
        if quoted is not None:
            usd[i] = quoted
        elif listed is not None:
            low = SPOT_DISCOUNT.get(o.cloud, (0.0, 0.0))[0] if o.market is Market.SPOT else 0.0
            usd[i] = listed * (1.0 - low)
    cap = np.where([o.market is Market.SPOT for o in offers], float(spot_capacity), np.inf)
    yearly = {z: float(g.yearly_g) for z, g in GRID_ZONES.items()}
    return Priors(usd, cap.astype(np.float64), yearly)


# -- samples -> series ----------------------------------------------------------------------


@dataclass
class _Series:
    """One (signal, key, source): samples ordered by when they became known."""

    known_s: FloatArray  # max(time, observed_at); ties: by time, the newest last
    observed_s: FloatArray
    valid_until_s: FloatArray  # inf: no limit
    value: FloatArray
    time_s: FloatArray

    def merge(self, other: _Series) -> _Series:
        cols = [np.concatenate([a, b]) for a, b in zip(self.cols(), other.cols(), strict=True)]
        order = np.lexsort((cols[4], cols[0]))
        merged = [c[order] for c in cols]
        keep = np.ones(len(order), dtype=bool)
        if len(order) > 1:  # the same sample twice (a re-read window): keep one
            same = (np.diff(merged[0]) == 0) & (np.diff(merged[1]) == 0) & (np.diff(merged[4]) == 0)
            keep[1:] = ~same
        return _Series(*(c[keep] for c in merged))

    def cols(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
        return self.known_s, self.observed_s, self.valid_until_s, self.value, self.time_s

    def drop_before(self, t_s: float) -> _Series:
        """Forget samples observed before `t_s`, keeping the last one before it (it may
        still be in force at `t_s` when its max age allows)."""
        i = max(int(np.searchsorted(self.known_s, t_s, side="right")) - 1, 0)
        return _Series(*(c[i:] for c in self.cols()))

    def at(self, times_s: FloatArray, max_age_s: float) -> tuple[FloatArray, FloatArray]:
        """(value, observed_s) in force at each time; NaN where none counts."""
        idx = np.searchsorted(self.known_s, times_s, side="right") - 1
        ok = idx >= 0
        i = np.maximum(idx, 0)
        obs = self.observed_s[i]
        ok &= (times_s - obs) <= max_age_s
        ok &= times_s < self.valid_until_s[i]
        value = np.where(ok, self.value[i], np.nan)
        return value, np.where(np.isnan(value), np.nan, obs)


SeriesKey = tuple[str, str, str]  # (signal, key, source)


def series_from_samples(samples: Iterable[SignalSample]) -> dict[SeriesKey, _Series]:
    """Group samples into series (forecasts and units no signal reads are left out)."""
    cols: dict[SeriesKey, list[tuple[float, float, float, float, float]]] = {}
    for s in samples:
        if s.source.endswith(FORECAST_SUFFIX):
            continue
        signal = _SIGNAL_OF.get((SignalKind(s.kind).value, s.unit))
        if signal is None:
            continue
        value = float(s.value)
        if s.unit == "placement_score" and math.isfinite(value):
            value = (
                1.0
                if value >= PLACEMENT_LIKELY
                else (0.0 if value <= PLACEMENT_UNLIKELY else math.nan)
            )
        t, o = s.time.timestamp(), s.observed_at.timestamp()
        vu = s.valid_until.timestamp() if s.valid_until is not None else math.inf
        cols.setdefault((signal, s.key, s.source), []).append((max(t, o), o, vu, value, t))
    out = {}
    for key, rows in cols.items():
        a = np.array(rows, dtype=np.float64)
        a = a[np.lexsort((a[:, 4], a[:, 0]))]
        out[key] = _Series(*(a[:, i].copy() for i in range(5)))
    return out


def series_from_frame(frame: Any) -> dict[SeriesKey, _Series]:
    """`series_from_samples` of a samples log (`signals.poll.read_samples`) at once: the
    same series, grouped with pandas and numpy instead of one Python object per sample (a
    30-day log of 200 offers is ~10^6 rows)."""
    import pandas as pd

    f = frame[~frame["source"].astype(str).str.endswith(FORECAST_SUFFIX)]
    pair = f["kind"].astype(str) + "\0" + f["unit"].astype(str)
    signal = pair.map({f"{k}\0{u}": sig for (k, u), sig in _SIGNAL_OF.items()})
    f, signal = f[signal.notna()], signal[signal.notna()]
    if f.empty:
        return {}
    value = f["value"].to_numpy(dtype=np.float64, na_value=np.nan).copy()
    score = (f["unit"].astype(str) == "placement_score").to_numpy() & np.isfinite(value)
    value[score] = np.where(
        value[score] >= PLACEMENT_LIKELY,
        1.0,
        np.where(value[score] <= PLACEMENT_UNLIKELY, 0.0, np.nan),
    )
    one_s = pd.Timedelta(seconds=1)
    epoch = pd.Timestamp(0, tz="UTC")

    def seconds(col: str) -> FloatArray:
        out: FloatArray = ((pd.to_datetime(f[col], utc=True) - epoch) / one_s).to_numpy(
            dtype=np.float64, na_value=np.inf
        )
        return out

    t, o, vu = seconds("time"), seconds("observed_at"), seconds("valid_until")
    known = np.maximum(t, o)
    keys = pd.DataFrame(
        {
            "signal": signal.to_numpy(),
            "key": f["key"].astype(str).to_numpy(),
            "source": f["source"].astype(str).to_numpy(),
        }
    )
    out: dict[SeriesKey, _Series] = {}
    groups: dict[Any, Any] = keys.groupby(["signal", "key", "source"], sort=False).indices
    for (sig, key, source), idx in groups.items():
        rows = idx[np.lexsort((t[idx], known[idx]))]
        out[(str(sig), str(key), str(source))] = _Series(
            known[rows], o[rows], vu[rows], value[rows], t[rows]
        )
    return out


# -- series -> a grid over given offers -----------------------------------------------------


def _candidates(offer: Offer, signal: str) -> list[str]:
    """The keys a signal of `offer` may come from, best first."""
    if signal == "price":
        m = offer.market.value
        return [
            price_key(offer.cloud, offer.region, offer.zone, offer.instance_type, m),
            price_key(offer.cloud, offer.region, "", offer.instance_type, m),
        ]
    if signal == "capacity":
        return [
            spot_key(offer.cloud, offer.region, offer.zone, offer.instance_type),
            spot_key(offer.cloud, offer.region, offer.zone, ""),
        ]
    return [offer.grid_zone]


def _rank(signal: str, source: str) -> tuple[int, str]:
    order = SOURCE_PRIORITY.get(signal, ())
    return (order.index(source) if source in order else len(order), source)


def _fill(
    signal: str,
    by_key: Mapping[tuple[str, str], list[tuple[tuple[int, str], str, _Series]]],
    targets: Sequence[tuple[int, list[str]]],
    times_s: FloatArray,
    max_age_s: float,
) -> tuple[FloatArray, list[str], FloatArray]:
    """One signal's rows: per column, its keys in order and each key's sources best first;
    the first that counts at a time fills it. Also each column's source and age now."""
    out = np.full((len(times_s), len(targets)), np.nan)
    src = ["" for _ in targets]
    age = np.full(len(targets), np.nan)
    last = times_s[-1]
    for col, keys in targets:
        filled = out[:, col]
        for key in keys:
            for _, source, s in by_key.get((signal, key), ()):
                v, obs = s.at(times_s, max_age_s)
                take = np.isnan(filled) & ~np.isnan(v)
                if not take.any():
                    continue
                filled[take] = v[take]
                if take[-1]:
                    src[col] = source
                    age[col] = last - obs[-1]
        out[:, col] = filled
    return out, src, age


def grid_from_series(
    series: Mapping[SeriesKey, _Series],
    offers: Sequence[Offer],
    times_s: FloatArray,
    *,
    tick_s: int,
    priors: Priors,
    max_ages: MaxAges,
) -> tuple[SignalGrid, SignalBasis]:
    """A grid over `offers` with one row per time of `times_s` (evenly spaced by `tick_s`),
    and the basis of its last row."""
    by_key: dict[tuple[str, str], list[tuple[tuple[int, str], str, _Series]]] = {}
    for (signal, key, source), s in series.items():
        by_key.setdefault((signal, key), []).append((_rank(signal, source), source, s))
    for items in by_key.values():
        items.sort(key=lambda x: x[0])

    zones = sorted({o.grid_zone for o in offers})
    zone_col = np.array([zones.index(o.grid_zone) for o in offers], dtype=np.int64)
    spot = np.array([o.market is Market.SPOT for o in offers], dtype=bool)
    values: dict[str, FloatArray] = {}
    sources: dict[str, list[str]] = {}
    ages: dict[str, FloatArray] = {}
    for signal in SIGNALS:
        per_zone = signal not in ("price", "capacity")
        targets = (
            [(z, [zone]) for z, zone in enumerate(zones)]
            if per_zone
            else [
                (o, _candidates(offer, signal) if signal != "capacity" or spot[o] else [])
                for o, offer in enumerate(offers)
            ]
        )
        values[signal], sources[signal], ages[signal] = _fill(
            signal, by_key, targets, times_s, max_ages.of(signal)
        )

    # priors where nothing counts
    price = values["price"]
    no_price = np.isnan(price)
    price = np.where(no_price, priors.usd_per_hour[None, :], price)
    cap = values["capacity"]
    no_cap = np.isnan(cap) & spot[None, :]
    cap = np.where(spot[None, :], np.where(no_cap, priors.spot_capacity[None, :], cap), np.inf)
    carbon_z = values["carbon"]
    known_z = ~np.isnan(carbon_z)
    yearly = np.array([priors.yearly_g_per_kwh.get(z, WORLD_AVG_G_PER_KWH) for z in zones])
    carbon_z = np.where(known_z, carbon_z, yearly[None, :])
    with np.errstate(invalid="ignore"):
        curtailing_z = (np.nan_to_num(values["curtailment"]) > 0) | (
            np.nan_to_num(values["power_price"], nan=1.0) < 0
        )

    def prior(signal: str, cols: Iterable[int], text: str) -> None:
        for c in cols:
            if not sources[signal][c]:
                sources[signal][c] = f"prior: {text}"

    prior("price", np.flatnonzero(no_price[-1]), "list price")
    prior("capacity", np.flatnonzero(no_cap[-1]), "assumed capacity")
    prior("capacity", np.flatnonzero(~spot), "on-demand")
    prior("carbon", np.flatnonzero(~known_z[-1]), "yearly average")
    prior("carbon_marginal", range(len(zones)), "none")
    prior("curtailment", range(len(zones)), "none")
    prior("power_price", range(len(zones)), "none")

    start = datetime.fromtimestamp(float(times_s[0]), UTC)
    grid = SignalGrid(
        start=start,
        tick_s=tick_s,
        offers=tuple(offers),
        usd_per_hour=price,
        spot_capacity=cap,
        carbon_g_per_kwh=carbon_z[:, zone_col],
        carbon_marginal_g_per_kwh=values["carbon_marginal"][:, zone_col],
        carbon_hourly_known=known_z[:, zone_col],
        curtailing=curtailing_z[:, zone_col],
    )
    basis = SignalBasis(
        source={
            s: tuple(
                sources[s][int(c)]
                for c in (zone_col if s not in ("price", "capacity") else range(len(offers)))
            )
            for s in SIGNALS
        },
        age_s={
            s: (ages[s][zone_col] if s not in ("price", "capacity") else ages[s]) for s in SIGNALS
        },
    )
    return grid, basis


def history_times(now_s: float, tick_s: int, lookback_s: float) -> FloatArray:
    """Row times of a frame at `now_s`: every `tick_s` back over `lookback_s`, ending at now."""
    n = max(1, int(lookback_s // tick_s) + 1)
    return now_s - tick_s * np.arange(n - 1, -1, -1, dtype=np.float64)


#: Polled samples: `SignalSample`s, or the samples log's frame (`signals.poll.read_samples`).
Samples: TypeAlias = "Iterable[SignalSample] | pd.DataFrame"


def grid_from_samples(
    samples: Samples,
    offers: Sequence[Offer],
    start_s: float,
    end_s: float,
    *,
    tick_s: int,
    priors: Priors,
    max_ages: MaxAges | None = None,
) -> SignalGrid:
    """A replay grid over [start, end) from polled samples (`SignalSample`s, or the samples
    log's frame as `read_samples` gives it), by the live view's rule: the row at each tick
    is what a live controller would have known then."""
    n = max(1, math.ceil((end_s - start_s) / tick_s))
    times = start_s + tick_s * np.arange(n, dtype=np.float64)
    grid, _ = grid_from_series(
        series_from_frame(samples) if hasattr(samples, "columns") else series_from_samples(samples),
        offers,
        times,
        tick_s=tick_s,
        priors=priors,
        max_ages=max_ages or MaxAges(),
    )
    return grid


# -- the live view --------------------------------------------------------------------------


class SampleReader(Protocol):
    def observed_samples(self, start_s: float, end_s: float) -> list[SignalSample]: ...


class StoreSignalView:
    """The live view over a state store's samples (see the module docstring).

    It keeps what it read between frames and asks the store only for samples observed since
    the previous frame (a one-shot tick reads the whole lookback once)."""

    def __init__(
        self,
        store: SampleReader,
        offers: Sequence[Offer],
        *,
        tick_s: int,
        priors: Priors,
        max_ages: MaxAges | None = None,
        lookback_s: float = DEFAULT_LOOKBACK_S,
    ) -> None:
        if tick_s <= 0:
            raise ValueError("tick_s must be positive")
        self.store = store
        self._offers = tuple(offers)
        self._tick_s = int(tick_s)
        self.priors = priors
        self.max_ages = max_ages or MaxAges()
        self.lookback_s = float(lookback_s)
        self._series: dict[SeriesKey, _Series] = {}
        self._read_until_s: float | None = None
        # (signal, key) pairs some offer reads: only they can make the frame stale.
        self._keys = {
            (sig, key) for o in self._offers for sig in SIGNALS for key in _candidates(o, sig)
        }

    @property
    def offers(self) -> tuple[Offer, ...]:
        return self._offers

    @property
    def tick_s(self) -> int:
        return self._tick_s

    def _refresh(self, now_s: float) -> None:
        horizon = now_s - self.lookback_s - self.max_ages.longest_s
        lo = horizon if self._read_until_s is None else max(horizon, self._read_until_s - 60.0)
        if self._read_until_s is not None and now_s < self._read_until_s - 60.0:
            self._series, lo = {}, horizon  # the clock went back: start over
        new = series_from_samples(self.store.observed_samples(lo, now_s + 1e-3))
        for key, s in new.items():
            old = self._series.get(key)
            self._series[key] = s if old is None else old.merge(s)
        self._series = {k: s.drop_before(horizon) for k, s in self._series.items()}
        self._read_until_s = max(now_s, self._read_until_s or now_s)

    def frame(self, now_s: float) -> SignalFrame:
        self._refresh(now_s)
        times = history_times(now_s, self._tick_s, self.lookback_s)
        grid, basis = grid_from_series(
            self._series,
            self._offers,
            times,
            tick_s=self._tick_s,
            priors=self.priors,
            max_ages=self.max_ages,
        )
        stale = self._stale(now_s, basis)
        return SignalFrame(grid, grid.n_ticks - 1, stale, basis)

    def _stale(self, now_s: float, basis: SignalBasis) -> tuple[str, ...]:
        """Signals were polled but none of them counts now: the poller stopped. (A signal
        never polled is not stale: its prior is all there is, and the basis says so.)"""
        polled = [
            (k, s)
            for k, s in self._series.items()
            if k[2] != OBSERVED_SOURCE and (k[0], k[1]) in self._keys
        ]
        if not polled:
            return ()
        kinds = {k[0] for k, _ in polled}
        if any(not src.startswith("prior") for sig in kinds for src in basis.source[sig]):
            return ()
        newest = datetime.fromtimestamp(max(float(s.observed_s[-1]) for _, s in polled), UTC)
        return (
            f"signals are stale: nothing polled counts any more (the newest sample was "
            f"observed at {newest:%Y-%m-%d %H:%M} UTC; max age: price "
            f"{_age_words(self.max_ages.price_s)}, carbon "
            f"{_age_words(self.max_ages.carbon_s)}): is the signals DAG running?",
        )


def _age_words(seconds: float) -> str:
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
