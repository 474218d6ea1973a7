"""The built-in scenario: a seeded, synthetic trace calibrated on published facts.

This is the product's offline default (DESIGN.md §6): `generate(seed, days)` returns a
`Trace` in the trace-directory format of `traces.py`, so replay, tests and the demo run
without a network. Real history (`heliotrope traces download` / import) has the same shape.

What is generated (every random draw comes from a numpy Generator seeded by `seed` and the
name of what it draws, so the same seed gives identical frames and one series does not
change when another is added):

- offers: 10 regions of AWS and GCP on three continents, two zones each, with real GPU
  instance types for the region; GPU type and count, grid zone and list prices come from
  `orchestrator.catalog`.
- prices: on-demand list price per (region, instance type); spot price per AWS zone or
  GCP region, a discount drawn in the published range and a slow mean-reverting walk in
  log price that changes every few hours (AWS) or about monthly (GCP). Change log.
- spot: per (zone, instance type) a two-state Markov chain (capacity / no capacity), one
  step per tick, with interruption rates from AWS Spot Advisor bands and outage lengths
  from the Can't Be Late / SkyNomad availability traces. Change log (run-length).
- grid: hourly per grid zone: average (life-cycle) carbon intensity at the zone's real
  yearly level with a solar dip and AR(1) weather noise; marginal intensity (gas or coal on
  the margin, 0 while renewables are curtailed); curtailment (CAISO spring midday solar,
  German wind); wholesale power price with a diurnal shape, negative only while curtailing;
  and the zone's yearly average once at the start.

Grid rows are samples, not a change log: they age out after the metric's max age (2 h),
so every hour carries a row even when the value repeats.
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pandas as pd

from orchestrator.catalog import grid_zone, instance_gpus, on_demand_usd_per_hour
from orchestrator.errors import InputError
from orchestrator.signals.traces import Trace, make_manifest

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_START: Final = datetime(2024, 4, 1, tzinfo=UTC)
SOURCE: Final = "scenario"

# ---------------------------------------------------------------------------------------
# The scenario's regions and the instance types offered in each (the scenario's definition,
# not a catalog). Instance availability per region follows the providers' price lists: AWS
# from the SkyPilot catalog v8 snapshot of EC2 prices (skypilot-org/skypilot-catalog,
# catalogs/v8/aws/vms.csv), GCP from the Cloud Billing catalog history in
# Cyclenerd/google-cloud-pricing-cost-calculator (pricing.yml). `price_factor` is the
# region's on-demand price relative to the catalog's us-east-1 / us-central1 list price,
# averaged over these instance types in the same sources (e.g. AWS eu-central-1 p4d 27.43
# vs 21.96 $/h; GCP asia-northeast1 a2-ultragpu-1g 6.45 vs 5.03 $/h).
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Region:
    cloud: str
    region: str
    zones: tuple[str, str]
    instance_types: tuple[str, ...]
    price_factor: float


_AWS_ALL: Final = ("p3.2xlarge", "p4d.24xlarge", "p5.48xlarge", "g6.xlarge")
_GCP_ALL: Final = ("a2-highgpu-8g", "a2-ultragpu-1g", "a3-highgpu-8g", "g2-standard-4")

REGIONS: Final[tuple[_Region, ...]] = (
    _Region("aws", "us-east-1", ("us-east-1a", "us-east-1c"), _AWS_ALL, 1.00),
    # us-west-1 lists only p5 among these types in the snapshot.
    _Region("aws", "us-west-1", ("us-west-1b", "us-west-1c"), ("p5.48xlarge",), 1.25),
    _Region("aws", "us-west-2", ("us-west-2a", "us-west-2b"), _AWS_ALL, 1.00),
    _Region(
        "aws",
        "eu-central-1",
        ("eu-central-1a", "eu-central-1b"),
        ("p3.2xlarge", "p4d.24xlarge", "g6.xlarge"),
        1.25,
    ),
    _Region(
        "aws",
        "eu-north-1",
        ("eu-north-1a", "eu-north-1b"),
        ("p4d.24xlarge", "p5.48xlarge", "g6.xlarge"),
        1.07,
    ),
    _Region("aws", "ap-southeast-2", ("ap-southeast-2a", "ap-southeast-2b"), _AWS_ALL, 1.32),
    _Region("gcp", "us-central1", ("us-central1-a", "us-central1-b"), _GCP_ALL, 1.00),
    _Region("gcp", "europe-west4", ("europe-west4-a", "europe-west4-b"), _GCP_ALL, 1.06),
    _Region("gcp", "europe-west1", ("europe-west1-b", "europe-west1-c"), _GCP_ALL, 1.07),
    _Region("gcp", "asia-northeast1", ("asia-northeast1-a", "asia-northeast1-c"), _GCP_ALL, 1.22),
)

# ---------------------------------------------------------------------------------------
# Grid zones.
# yearly_g: Electricity Maps yearly zone average 2024, life-cycle gCO2eq/kWh (Electricity
#   Maps data portal, ODbL, as republished by thegreenwebfoundation/co2.js).
# solar_dip: fraction by which full sun lowers the average intensity. Fitted on the mean
#   diurnal profile of Electricity Maps hourly 2024 data (solar-noon / daily mean: CISO
#   0.59, AU-NSW 0.62, DE 0.77, JP-TK 0.78, PJM 0.98); CISO's midday dip of ~40% against
#   the evening is the "duck curve" (CAISO, "What the duck curve tells us", 2016).
# weather_cv: log-scale std of the day-to-day weather noise; from the same hourly data (cv
#   of daily means 2024: GB 0.37, DE 0.30, CISO 0.25, AU-NSW and PJM 0.10, JP-TK 0.03),
#   wind- and hydro-heavy zones without hourly data set by analogy.
# coal_share: share of hours with coal on the margin (gas otherwise), more at night.
#   Siler-Evans et al., "Marginal emissions factors for the US electricity system", Environ.
#   Sci. Technol. 2012: coal on the margin mostly in MISO and PJM at night; gas in CAISO.
# price_usd_per_mwh: mean hourly wholesale price 2023: CAISO NP15 DA 62, PJM 36, DE-LU 103,
#   NL 103, BE 105, JEPX Tokyo 89, AEMO NSW 96 (ISO / exchange data as standardized in
#   HewlettPackard/green-dcc); MISO ~33 (MISO IMM 2023 State of the Market), Mid-C ~60 and
#   Nord Pool SE3 ~60 (approximate 2023 levels).
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _GridZone:
    lat: float
    lon: float
    yearly_g: float
    solar_dip: float
    weather_cv: float
    coal_share: float
    coal_g: float
    price_usd_per_mwh: float
    price_solar_dip: float  # midday price dip at full sun (fraction)
    price_peak: float  # morning/evening peak bump (fraction)
    solar_curtailment_mw: float = 0.0  # spring midday peak, mean over curtailment days
    wind_curtailment_mw_per_sigma: float = 0.0  # per std of wind above the threshold
    curtailment_cap_mw: float = 10000.0
    negative_price_above_mw: float = 2500.0  # curtailment beyond which the price is < 0


_Z = _GridZone
# fmt: off
GRID_ZONES: Final[Mapping[str, _GridZone]] = {
    #                lat     lon  yearly  dip    cv  coal coal_g price p_dip  peak
    "US-MIDA-PJM":  _Z(39.0,  -77.5, 403, 0.03, 0.08, 0.35,  950,  36.0, 0.10, 0.35),
    "US-NW-BPAT":   _Z(45.6, -121.2, 109, 0.05, 0.30, 0.10,  950,  60.0, 0.15, 0.30),
    # CAISO: 3.4 TWh of wind and solar curtailed in 2024, 93% solar, mostly in spring (EIA,
    # Today in Energy, 2025; CAISO "Managing oversupply"), several GW at midday. The
    # scenario curtails ~2.6 TWh/yr, 0.5-0.9 TWh in each of March-May.
    "US-CAL-CISO":  _Z(37.3, -121.9, 229, 0.56, 0.15, 0.00,  950,  62.0, 0.55, 0.45,
                       solar_curtailment_mw=8000.0),
    "US-MIDW-MISO": _Z(41.3,  -95.9, 487, 0.05, 0.15, 0.60,  950,  33.0, 0.10, 0.30),
    # Germany: about 10 TWh of renewable output (mostly wind) curtailed in 2023 for grid
    # congestion (Bundesnetzagentur, Netzengpassmanagement 2023). The scenario curtails
    # ~5 TWh/yr: congestion is regional and the national figure overstates one zone's share.
    # Negative prices in ~5% of hours (EPEX DE-LU: 301 h in 2023, 457 h in 2024).
    "DE":           _Z(50.1,    8.7, 341, 0.34, 0.30, 0.50, 1050, 103.0, 0.35, 0.30,
                       wind_curtailment_mw_per_sigma=8000.0, curtailment_cap_mw=15000.0,
                       negative_price_above_mw=5000.0),
    "NL":           _Z(53.4,    6.8, 251, 0.25, 0.28, 0.15,  950, 103.0, 0.30, 0.30),
    "BE":           _Z(50.5,    3.8, 153, 0.15, 0.20, 0.05,  950, 105.0, 0.25, 0.30),
    "SE-SE3":       _Z(59.3,   18.1,  21, 0.00, 0.30, 0.20,  950,  60.0, 0.05, 0.30),
    "JP-TK":        _Z(35.7,  139.7, 539, 0.33, 0.05, 0.35,  950,  89.0, 0.25, 0.25),
    "AU-NSW":       _Z(-33.9, 151.2, 541, 0.53, 0.08, 0.80,  950,  96.0, 0.45, 0.40),
}
# fmt: on
# Local clock of each zone (demand peaks follow the clock, the sun follows longitude).
TIMEZONES: Final[Mapping[str, str]] = {
    "US-MIDA-PJM": "America/New_York",
    "US-NW-BPAT": "America/Los_Angeles",
    "US-CAL-CISO": "America/Los_Angeles",
    "US-MIDW-MISO": "America/Chicago",
    "DE": "Europe/Berlin",
    "NL": "Europe/Amsterdam",
    "BE": "Europe/Brussels",
    "SE-SE3": "Europe/Stockholm",
    "JP-TK": "Asia/Tokyo",
    "AU-NSW": "Australia/Sydney",
}

# Marginal plants, direct operating emissions (gCO2/kWh): gas combined cycle ~370-450 plus
# peakers, coal ~900-1000, lignite above 1000 (Siler-Evans et al. 2012; IPCC AR5 WG3 Annex
# III direct emissions). While renewables are curtailed the marginal unit is the curtailed
# renewable: 0 (WattTime's MOER convention for curtailment).
GAS_MARGINAL_G: Final = 450.0

# Spot markets.
# Discounts: AWS "Spot Instances ... up to 90% off On-Demand" (AWS EC2 Spot page); GCP Spot
# VMs "60-91% discount" (Compute Engine docs, "Spot VMs").
SPOT_DISCOUNT: Final[Mapping[str, tuple[float, float]]] = {
    "aws": (0.60, 0.90),
    "gcp": (0.60, 0.91),
}
# Mean hours between spot price changes. AWS: the public spot price archive for p3.2xlarge
# in 9 zones (Feb-Mar 2023, SkyNomad artifact) changes every 6-27 h, within about +-15%.
# GCP: Spot prices for GPU VMs in the Cloud Billing catalog history change roughly monthly
# (Cyclenerd/google-cloud-pricing-cost-calculator, 2024-2026).
SPOT_PRICE_CHANGE_H: Final[Mapping[str, tuple[float, float]]] = {
    "aws": (6.0, 24.0),
    "gcp": (24.0 * 30, 24.0 * 45),
}
SPOT_PRICE_SIGMA: Final = 0.08  # stationary std of the log-price walk
SPOT_PRICE_PHI: Final = 0.8  # per-change mean reversion of the log-price walk

# AWS Spot Instance Advisor "frequency of interruption": share of instances interrupted per
# month, in bands <5%, 5-10%, 10-15%, 15-20%, >20% (aws.amazon.com/ec2/spot/instance-advisor).
INTERRUPTION_BANDS: Final = ((0.0, 0.05), (0.05, 0.10), (0.10, 0.15), (0.15, 0.20), (0.20, 1.0))
# GPU pools sit mostly in the top band (an assumption of this scenario, not a published
# distribution): the Can't Be Late V100 and SkyNomad H100 traces show several interruptions
# per day in most zones.
BAND_WEIGHTS: Final = (0.05, 0.05, 0.05, 0.05, 0.80)
# Top band (open-ended): mean availability per pool drawn in the range of the Can't Be Late
# 1-node p3.2xlarge traces (NSDI'24, skypilot-org/spot-traces, Feb 2023: 16.7% in
# us-east-1a to 90.5% in us-west-2b); SkyNomad's GCP H100 traces span 24%-99.9%.
TOP_BAND_AVAILABILITY: Final = (0.17, 0.91)
# Mean cycle (one available run plus one outage, h), log-uniform per top-band pool: 1.6-14 h
# per trace in the Can't Be Late traces (e.g. us-east-1a: 0.7 h up, 3.6 h down; us-west-2b:
# 10.4 h up, 1.1 h down), 2.5-30 h in SkyNomad's GCP H100 traces.
CYCLE_MEAN_H: Final = (2.0, 16.0)
# Mean outage length (h) in the lower bands, log-uniform: per-trace mean unavailable run
# 0.5-3.6 h in the Can't Be Late V100 traces.
OUTAGE_MEAN_H: Final = (0.5, 4.0)
# Capacity while available: instances obtainable, 1..8 (1..4 for 8-GPU instances, like the
# 0-4 SpotHedge GCP A100 traces, EuroSys'25).
MAX_CAPACITY_SMALL: Final = 8
MAX_CAPACITY_8GPU: Final = 4

_HOUR_S: Final = 3600
_MONTH_S: Final = 30 * 86400


# ---------------------------------------------------------------------------------------
# Random streams
# ---------------------------------------------------------------------------------------


def _rng(seed: int, *parts: str) -> np.random.Generator:
    """A generator for one named series: depends on `seed` and the name only."""
    key = zlib.crc32("/".join(parts).encode())
    return np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, key])


def _log_uniform(rng: np.random.Generator, bounds: tuple[float, float]) -> float:
    return math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1])))


def _ar1(eps: FloatArray, phi: float) -> FloatArray:
    """Stationary AR(1) with unit variance driven by standard normals `eps` (n, k)."""
    out = np.empty_like(eps)
    scale = math.sqrt(1.0 - phi * phi)
    x = eps[0].copy()
    out[0] = x
    for i in range(1, eps.shape[0]):
        x = phi * x + scale * eps[i]
        out[i] = x
    return out


# ---------------------------------------------------------------------------------------
# Grid
# ---------------------------------------------------------------------------------------


def _sun(hours: pd.DatetimeIndex, lat: float, lon: float) -> FloatArray:
    """Sine of the sun's elevation (clipped at 0) at the middle of each hour: a clear-sky
    irradiance proxy (standard declination / hour-angle formulas)."""
    doy = hours.day_of_year.to_numpy().astype(np.float64)
    t = hours.hour.to_numpy().astype(np.float64) + 0.5
    decl = np.radians(23.44) * np.sin(2.0 * np.pi * (doy - 81.0) / 365.0)
    solar_time = (t + lon / 15.0) % 24.0
    hour_angle = 2.0 * np.pi * (solar_time - 12.0) / 24.0
    phi = math.radians(lat)
    sin_elev = math.sin(phi) * np.sin(decl) + math.cos(phi) * np.cos(decl) * np.cos(hour_angle)
    return np.asarray(np.clip(sin_elev, 0.0, None), dtype=np.float64)


def _peaks(local_hour: FloatArray) -> FloatArray:
    """Morning (~8h) and evening (~19h) demand peaks on the local clock, 0..1."""

    def bump(center: float, width: float) -> FloatArray:
        d = (local_hour - center + 12.0) % 24.0 - 12.0
        return np.exp(-0.5 * (d / width) ** 2)

    return np.clip(0.5 * bump(8.0, 1.5) + bump(19.0, 2.0), 0.0, 1.0)


def _local_hour(hours: pd.DatetimeIndex, tz: str) -> FloatArray:
    local = hours.tz_convert(tz)
    return local.hour.to_numpy().astype(np.float64) + 0.5


@functools.lru_cache(maxsize=64)
def _reference_year(z: _GridZone, tz: str) -> tuple[float, float]:
    """Year means of the carbon and price diurnal shapes (normalizers, so that a year of
    the scenario has the zone's yearly level whatever window is generated)."""
    year = pd.date_range("2023-01-01", periods=8760, freq="h", tz="UTC")
    sun = _sun(year, z.lat, z.lon)
    peaks = _peaks(_local_hour(year, tz))
    return float(np.mean(_carbon_shape(z, sun))), float(np.mean(_price_shape(z, sun, peaks)))


def _carbon_shape(z: _GridZone, sun: FloatArray) -> FloatArray:
    return 1.0 - z.solar_dip * sun


def _price_shape(z: _GridZone, sun: FloatArray, peaks: FloatArray) -> FloatArray:
    return (1.0 - z.price_solar_dip * sun) * (1.0 + z.price_peak * peaks)


def _spring(doy: FloatArray) -> FloatArray:
    """CAISO curtailment season: peaks March-May (EIA: curtailment is highest in spring,
    when demand is low and solar output high), a small base the rest of the year."""
    return np.exp(-(((doy - 105.0) / 55.0) ** 2))


def _grid_zone_frame(seed: int, name: str, hours: pd.DatetimeIndex) -> pd.DataFrame:
    z = GRID_ZONES[name]
    tz = TIMEZONES[name]
    n = len(hours)
    sun = _sun(hours, z.lat, z.lon)
    local_hour = _local_hour(hours, tz)
    peaks = _peaks(local_hour)
    carbon_norm, price_norm = _reference_year(z, tz)

    # Weather: AR(1) with a ~36 h decorrelation time (synoptic weather lasts days).
    phi = math.exp(-1.0 / 36.0)
    weather = _ar1(_rng(seed, "grid", name, "weather").standard_normal((n, 1)), phi)[:, 0]
    price_noise = _ar1(_rng(seed, "grid", name, "price").standard_normal((n, 1)), 0.9)[:, 0]

    # Average intensity: yearly level x solar dip x lognormal weather (mean 1). High
    # `weather` = calm and cloudy (more fossil), low = windy/sunny.
    cv = z.weather_cv
    carbon = z.yearly_g * _carbon_shape(z, sun) / carbon_norm * np.exp(cv * weather - 0.5 * cv * cv)

    # Curtailment.
    curtail = np.zeros(n)
    if z.solar_curtailment_mw > 0:
        local = hours.tz_convert(tz)
        day_codes, day_index = pd.factorize(local.normalize())
        days = pd.DatetimeIndex(day_index)
        doy_day = days.day_of_year.to_numpy().astype(np.float64)
        season = _spring(doy_day)
        n_days = len(days)
        on = _rng(seed, "grid", name, "curtail-days").random(n_days) < 0.3 + 0.65 * season
        size = _rng(seed, "grid", name, "curtail-size").lognormal(-0.08, 0.4, n_days)  # mean 1
        day_mw = np.where(on, z.solar_curtailment_mw * (0.15 + 0.85 * season) * size, 0.0)
        cloudy = weather > 1.0  # cloudy weather: less sun, less oversupply
        threshold = 0.4  # the sun must be high (elevation > 24 degrees) to oversupply
        shape = np.clip((sun - threshold) / (1.0 - threshold), 0.0, None)
        curtail += day_mw[day_codes] * shape * np.where(cloudy, 0.3, 1.0)
    if z.wind_curtailment_mw_per_sigma > 0:
        wind = -weather  # windy weather pushes intensity down
        curtail += z.wind_curtailment_mw_per_sigma * np.clip(wind - 1.0, 0.0, None)
    curtail = np.round(np.minimum(curtail, z.curtailment_cap_mw), 1).astype(np.float64)
    curtailing = curtail > 0

    # Marginal intensity: gas or coal on the margin, coal more likely at night (low load).
    p_coal = np.clip(z.coal_share + 0.15 - 0.3 * np.clip(sun / 0.5, 0.0, 1.0), 0.0, 1.0)
    coal = _rng(seed, "grid", name, "marginal-plant").random(n) < p_coal
    jitter = np.clip(_rng(seed, "grid", name, "marginal-jitter").normal(0.0, 0.04, n), -0.1, 0.1)
    marginal = np.where(coal, z.coal_g, GAS_MARGINAL_G) * (1.0 + jitter)
    marginal = np.where(curtailing, 0.0, marginal)

    # Wholesale price: diurnal shape x lognormal noise (windy = cheap), always > 0 unless
    # curtailing; while curtailing it falls with the curtailed power and goes negative
    # beyond ~1 GW (CAISO and EPEX negative prices in oversupply hours), floored at the
    # EPEX harmonised minimum clearing price of -500 EUR/MWh.
    noise = 0.15 * weather + 0.20 * price_noise  # log-scale std 0.25
    price = (
        z.price_usd_per_mwh
        * _price_shape(z, sun, peaks)
        / price_norm
        * np.exp(noise - 0.5 * 0.25**2)
    )
    price_curtailed = np.maximum(15.0 * (1.0 - curtail / z.negative_price_above_mw), -500.0)
    price = np.where(curtailing, np.minimum(price, price_curtailed), price)

    metrics = {
        "carbon_avg_g_per_kwh": np.round(carbon, 2),
        "carbon_marginal_g_per_kwh": np.round(marginal, 1),
        "curtailment_mw": curtail,
        "power_price_usd_per_mwh": np.round(price, 2),
    }
    frames = [
        pd.DataFrame(
            {"time": hours, "grid_zone": name, "metric": metric, "value": values, "source": SOURCE}
        )
        for metric, values in metrics.items()
    ]
    frames.append(
        pd.DataFrame(
            {
                "time": hours[:1],
                "grid_zone": name,
                "metric": "carbon_avg_yearly_g_per_kwh",
                "value": [float(z.yearly_g)],
                "source": "Electricity Maps yearly 2024 (life-cycle)",
            }
        )
    )
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------------------------------
# Spot capacity and prices
# ---------------------------------------------------------------------------------------


def _runs(
    rng: np.random.Generator, n: int, p_leave: tuple[float, float], first: int
) -> tuple[IntArray, IntArray]:
    """Run starts (tick index) and states of a two-state Markov chain over `n` ticks.

    `p_leave[s]` is the per-tick probability of leaving state s; run lengths are geometric,
    which is exactly the per-tick chain. Drawn in fixed chunks so a longer horizon extends
    a shorter one."""
    starts: list[IntArray] = []
    states: list[IntArray] = []
    t = 0
    state = first
    chunk = 256
    while t < n:
        p = np.array([p_leave[(state + i) % 2] for i in range(chunk)])
        lengths = rng.geometric(p).astype(np.int64)
        ends = t + np.cumsum(lengths)
        begin = np.concatenate(([t], ends[:-1]))
        st = (state + np.arange(chunk)) % 2
        keep = begin < n
        starts.append(begin[keep])
        states.append(st[keep])
        t = int(ends[-1])
        state = (state + chunk) % 2
    return np.concatenate(starts), np.concatenate(states)


@dataclass(frozen=True, slots=True)
class _Pool:
    """One spot capacity pool: an instance type in a zone."""

    cloud: str
    region: str
    zone: str
    instance_type: str
    gpu_count: int


def _spot_pool(
    seed: int, pool: _Pool, n_ticks: int, tick_s: int
) -> tuple[IntArray, FloatArray, float]:
    """Change rows (tick index, capacity) of one pool and its target availability."""
    rng = _rng(seed, "spot", pool.cloud, pool.zone, pool.instance_type, "params")
    band = int(rng.choice(len(INTERRUPTION_BANDS), p=BAND_WEIGHTS))
    if band < len(INTERRUPTION_BANDS) - 1:
        lo, hi = INTERRUPTION_BANDS[band]
        monthly = rng.uniform(max(lo, 0.005), hi)
        # Share interrupted within a month -> per-tick hazard of a running instance.
        p_down = 1.0 - (1.0 - monthly) ** (tick_s / _MONTH_S)
        outage_h = _log_uniform(rng, OUTAGE_MEAN_H)
        p_up = min(1.0, tick_s / (outage_h * _HOUR_S))
        availability = p_up / (p_up + p_down)
    else:
        # Availability a and mean cycle C (one up run + one outage): up a*C, down (1-a)*C.
        availability = rng.uniform(*TOP_BAND_AVAILABILITY)
        cycle_h = _log_uniform(rng, CYCLE_MEAN_H)
        p_up = min(1.0, tick_s / ((1.0 - availability) * cycle_h * _HOUR_S))
        p_down = min(1.0, tick_s / (availability * cycle_h * _HOUR_S))
    first = 1 if rng.random() < availability else 0  # 1 = available, stationary start
    chain = _rng(seed, "spot", pool.cloud, pool.zone, pool.instance_type, "chain")
    # State index 0 = unavailable (leaves with p_up), 1 = available (leaves with p_down).
    starts, states = _runs(chain, n_ticks, (p_up, p_down), first)
    cap_rng = _rng(seed, "spot", pool.cloud, pool.zone, pool.instance_type, "capacity")
    top = MAX_CAPACITY_8GPU if pool.gpu_count >= 8 else MAX_CAPACITY_SMALL
    counts = cap_rng.integers(1, top + 1, len(states))
    capacity = np.where(states == 1, counts, 0).astype(np.float64)
    return starts, capacity, availability


def _spot_price_series(
    seed: int,
    cloud: str,
    where: str,
    instance_type: str,
    *,
    on_demand: float,
    n_ticks: int,
    tick_s: int,
) -> tuple[IntArray, FloatArray]:
    """Change rows (tick index, $/h) of one spot price: a discount drawn in the published
    range, times a mean-reverting walk in log price that moves at random change times."""
    rng = _rng(seed, "price", cloud, where, instance_type, "params")
    lo, hi = SPOT_DISCOUNT[cloud]
    discount = rng.uniform(lo + 0.02, hi - 0.02)
    change_h = rng.uniform(*SPOT_PRICE_CHANGE_H[cloud])
    p_change = min(1.0, tick_s / (change_h * _HOUR_S))
    walk = _rng(seed, "price", cloud, where, instance_type, "walk")
    ticks: list[IntArray] = []
    t = 0
    chunk = 256
    while t < n_ticks:
        gaps = walk.geometric(p_change, chunk).astype(np.int64)
        at = t + np.cumsum(gaps)
        ticks.append(at[at < n_ticks])
        t = int(at[-1])
    change_ticks = np.concatenate([np.zeros(1, dtype=np.int64), *ticks])
    eps = _rng(seed, "price", cloud, where, instance_type, "eps").standard_normal(
        (len(change_ticks), 1)
    )
    x = SPOT_PRICE_SIGMA * _ar1(eps, SPOT_PRICE_PHI)[:, 0]
    price = on_demand * (1.0 - discount) * np.exp(x - 0.5 * SPOT_PRICE_SIGMA**2)
    price = np.clip(price, on_demand * (1.0 - hi), on_demand * (1.0 - lo))
    price = np.round(price, 4)
    keep = np.concatenate(([True], price[1:] != price[:-1]))
    return change_ticks[keep], price[keep]


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def offers_frame() -> pd.DataFrame:
    """The scenario's offers (one row per instance type per zone), from the catalog."""
    rows: list[dict[str, Any]] = []
    for r in REGIONS:
        zone_of_grid = grid_zone(r.cloud, r.region)
        if zone_of_grid is None or zone_of_grid not in GRID_ZONES:
            raise ValueError(
                f"scenario region {r.cloud}/{r.region}: grid zone {zone_of_grid!r} "
                "has no scenario parameters"
            )
        for zone in r.zones:
            for itype in r.instance_types:
                gpus = instance_gpus(r.cloud, itype)
                if gpus is None:
                    raise ValueError(f"catalog has no GPUs for {r.cloud}/{itype}")
                rows.append(
                    {
                        "cloud": r.cloud,
                        "region": r.region,
                        "zone": zone,
                        "instance_type": itype,
                        "gpu_type": gpus[0],
                        "gpu_count": gpus[1],
                        "grid_zone": zone_of_grid,
                    }
                )
    return pd.DataFrame(rows)


def _validate(seed: int, days: float, start: datetime, tick_s: int) -> None:
    where = "scenario"
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InputError(where, "seed", "an integer", got=repr(seed))
    if not (isinstance(days, (int, float)) and math.isfinite(days) and days > 0):
        raise InputError(where, "days", "a positive number of days", got=repr(days))
    if start.tzinfo is None or start.utcoffset() is None:
        raise InputError(
            where,
            "start",
            "a tz-aware datetime",
            got=start.isoformat(),
            fix="pass e.g. datetime(2024, 4, 1, tzinfo=UTC)",
        )
    if not isinstance(tick_s, (int, np.integer)) or tick_s <= 0 or 86400 % int(tick_s) != 0:
        raise InputError(
            where,
            "tick_s",
            "a positive number of seconds dividing a day",
            got=repr(tick_s),
            fix="use e.g. 60, 300, 600 or 3600",
        )


def generate(
    seed: int,
    days: float,
    *,
    start: datetime = DEFAULT_START,
    tick_s: int = 600,
) -> Trace:
    """Generate the built-in scenario: `days` days from `start`, spot capacity and prices
    on a `tick_s` grid, grid signals hourly. Deterministic in `seed`."""
    _validate(seed, days, start, tick_s)
    seed = int(seed)
    tick_s = int(tick_s)
    start_ts = pd.Timestamp(start).tz_convert("UTC")
    span_s = days * 86400.0
    n_ticks = max(1, math.ceil(span_s / tick_s))
    n_hours = max(1, math.ceil(span_s / _HOUR_S))
    hours = pd.date_range(start_ts, periods=n_hours, freq="h")
    tick0 = start_ts.as_unit("ns")

    def tick_times(idx: IntArray) -> pd.DatetimeIndex:
        return pd.DatetimeIndex(tick0 + pd.to_timedelta(idx * tick_s, unit="s"))

    offers = offers_frame()

    # Prices: on-demand list price per (region, type) once; spot per AWS zone / GCP region.
    price_parts: list[pd.DataFrame] = []
    spot_parts: list[pd.DataFrame] = []
    for r in REGIONS:
        for itype in r.instance_types:
            base = on_demand_usd_per_hour(r.cloud, itype)
            if base is None:
                raise ValueError(f"catalog has no on-demand price for {r.cloud}/{itype}")
            od = round(base * r.price_factor, 4)
            price_parts.append(
                pd.DataFrame(
                    {
                        "time": [tick0],
                        "cloud": r.cloud,
                        "region": r.region,
                        "zone": "",
                        "instance_type": itype,
                        "market": "on_demand",
                        "usd_per_hour": [od],
                    }
                )
            )
            # AWS prices spot per availability zone; GCP per region (zone '' = all zones).
            for where in r.zones if r.cloud == "aws" else ("",):
                key = where or r.region
                idx, usd = _spot_price_series(
                    seed, r.cloud, key, itype, on_demand=od, n_ticks=n_ticks, tick_s=tick_s
                )
                price_parts.append(
                    pd.DataFrame(
                        {
                            "time": tick_times(idx),
                            "cloud": r.cloud,
                            "region": r.region,
                            "zone": where,
                            "instance_type": itype,
                            "market": "spot",
                            "usd_per_hour": usd,
                        }
                    )
                )
    columns = ("cloud", "region", "zone", "instance_type", "gpu_count")
    for cloud, region, zone, itype, count in zip(
        *(offers[c].tolist() for c in columns), strict=True
    ):
        pool = _Pool(str(cloud), str(region), str(zone), str(itype), int(count))
        idx, cap, _ = _spot_pool(seed, pool, n_ticks, tick_s)
        spot_parts.append(
            pd.DataFrame(
                {
                    "time": tick_times(idx),
                    "cloud": pool.cloud,
                    "zone": pool.zone,
                    "instance_type": pool.instance_type,
                    "capacity": cap,
                }
            )
        )

    zones_used = sorted(set(offers["grid_zone"]))
    grid = pd.concat([_grid_zone_frame(seed, z, hours) for z in zones_used], ignore_index=True)
    prices = pd.concat(price_parts, ignore_index=True)
    spot = pd.concat(spot_parts, ignore_index=True)
    prices = prices.sort_values(
        ["time", "cloud", "region", "zone", "instance_type", "market"], kind="stable"
    ).reset_index(drop=True)
    spot = spot.sort_values(["time", "cloud", "zone", "instance_type"], kind="stable").reset_index(
        drop=True
    )
    grid = grid.sort_values(["time", "grid_zone", "metric"], kind="stable").reset_index(drop=True)

    end = start_ts + timedelta(seconds=span_s)
    manifest = make_manifest(
        generator="scenario",
        seed=seed,
        days=float(days),
        tick_s=tick_s,
        start=start_ts.isoformat(),
        end=end.isoformat(),
        sources=list(SOURCES),
        notes=list(NOTES),
    )
    return Trace(offers=offers, prices=prices, spot=spot, grid=grid, manifest=manifest)


SOURCES: Final[Sequence[Mapping[str, str]]] = (
    {
        "name": "Electricity Maps yearly zone averages 2024 (life-cycle)",
        "ref": "Electricity Maps data portal (ODbL) via thegreenwebfoundation/co2.js",
        "used_for": "carbon_avg level per zone, carbon_avg_yearly_g_per_kwh",
    },
    {
        "name": "Electricity Maps hourly carbon intensity 2024",
        "ref": "Electricity Maps data portal (ODbL) via HewlettPackard/green-dcc",
        "used_for": "solar dip and weather variability per zone",
    },
    {
        "name": "CAISO duck curve; EIA Today in Energy (CAISO curtailed 3.4 TWh in 2024, 93% "
        "solar, mostly in spring)",
        "ref": "caiso.com 'What the duck curve tells us'; eia.gov/todayinenergy",
        "used_for": "CISO midday dip and spring midday solar curtailment",
    },
    {
        "name": "Bundesnetzagentur Netzengpassmanagement 2023 (~10 TWh renewables curtailed)",
        "ref": "bundesnetzagentur.de",
        "used_for": "DE wind curtailment",
    },
    {
        "name": "Siler-Evans et al. 2012, Marginal emissions factors for the US electricity "
        "system (Environ. Sci. Technol.); IPCC AR5 WG3 Annex III",
        "ref": "doi:10.1021/es300145v",
        "used_for": "marginal gas/coal intensity",
    },
    {
        "name": "Wholesale prices 2023: CAISO OASIS, PJM, EPEX/ENTSO-E, JEPX, AEMO",
        "ref": "as standardized in HewlettPackard/green-dcc",
        "used_for": "power price level per zone; negative prices in oversupply",
    },
    {
        "name": "AWS EC2 Spot ('up to 90% off'); GCP Spot VMs ('60-91% discount')",
        "ref": "aws.amazon.com/ec2/spot; cloud.google.com/compute/docs/instances/spot",
        "used_for": "spot discount range",
    },
    {
        "name": "AWS Spot Instance Advisor interruption bands (<5%, 5-10%, 10-15%, 15-20%, >20%)",
        "ref": "aws.amazon.com/ec2/spot/instance-advisor",
        "used_for": "spot interruption rate",
    },
    {
        "name": "Can't Be Late (NSDI'24) spot availability traces; SkyNomad GCP H100 traces; "
        "SpotHedge (EuroSys'25) GCP A100 traces",
        "ref": "skypilot-org/spot-traces; andylizf/skynomad-artifact; MaoZiming/spothedge_ae",
        "used_for": "availability range, outage lengths, capacity counts",
    },
    {
        "name": "AWS spot price archive, p3.2xlarge, 9 zones, Feb-Mar 2023; GCP billing catalog "
        "history",
        "ref": "SkyNomad artifact; Cyclenerd/google-cloud-pricing-cost-calculator",
        "used_for": "spot price change frequency and amplitude",
    },
    {
        "name": "On-demand list prices and regional price ratios",
        "ref": "orchestrator.catalog.LIST_PRICES; skypilot-catalog v8 aws/vms.csv; "
        "Cyclenerd pricing.yml",
        "used_for": "on-demand prices",
    },
)

NOTES: Final[Sequence[str]] = (
    "Synthetic scenario: calibrated on published levels and shapes, not a recording.",
    "carbon_avg_g_per_kwh is life-cycle; carbon_marginal_g_per_kwh is direct operating "
    "emissions of the marginal plant, 0 while the zone curtails renewables.",
    "Spot prices: AWS per availability zone, GCP per region (zone '').",
    "Spot capacity is a two-state Markov chain per (zone, instance type); capacity 0 = "
    "none obtainable (running spot instances are interrupted).",
    "Grid rows are hourly samples (not a change log); prices and spot are change logs.",
    "Interruption band weights for GPU pools (80% in the >20% band) are a scenario assumption.",
)
