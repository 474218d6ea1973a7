"""The cost, energy, carbon and migration model every policy, the loop and the replay share.

DESIGN.md §4. Per job j on offer o:

- instances: ``ceil(gpus_j / gpu_count_o)``; a job never shares an instance.
- progress: ``tp[g(o)] * gpus_j`` reference GPU-hours per hour (reference: one A100-80GB),
  zero while the cold start (boot, restore, checkpoint transfer) runs.
- dollars: ``price_o * instances`` per hour, billed from launch (cold start included).
- energy: ``power_kw_o * instances * PUE * hours``; kgCO2 = kWh x intensity / 1000
  (`orchestrator.units.kg_co2`), both location-based (grid average) and marginal. Where a
  zone has no marginal signal the marginal rate is taken as the average, except while the
  zone curtails renewables, when the marginal kWh would otherwise be thrown away and counts
  0 (Wiesner & Kao 2025 argue the average is a poor proxy there). Energy drawn while the
  zone curtails is also reported.
- migration: egress ``S_j * e(src -> dst)`` dollars and ``S_j / bandwidth`` hours of
  transfer, plus the cold start; a preemption also loses the work since the last checkpoint.
  Nothing moves within one region (`per_gb`, the one rule `move_cost` and `move_matrices`
  share).
- objective: ``J = dollars + carbon_usd_per_tonne * kgCO2 / 1000`` (`objective_usd`).

Every formula here takes floats or numpy arrays alike. This module sits below the policies
and the loop (the import-linter layers contract in pyproject.toml): it needs only the model,
the catalog and the units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator import catalog, units
from orchestrator.model import (
    BoolArray,
    CostSettings,
    FloatArray,
    IntArray,
    JobSpec,
    Location,
    Offer,
)
from orchestrator.units import Num


def relative_throughput(job: JobSpec, gpu_type: str) -> float:
    """Throughput of one GPU of `gpu_type` for this job, relative to one A100-80GB."""
    override = job.throughput.get(gpu_type)
    if override is not None:
        return float(override)
    return catalog.gpu(gpu_type).relative_throughput


@dataclass(frozen=True, slots=True)
class JobOfferFit:
    """Static job x offer facts, computed once per (jobs, offers) pair.

    `rate[j, o]` reference GPU-hours per hour (0: not allowed); `instances[j, o]`;
    `power_kw[j, o]` IT power of all the job's instances (before PUE); `home[j, o]` whether
    offer o is in job j's home region. Per-job vectors repeat the specs as arrays so that
    policies stay vectorized.
    """

    rate: FloatArray
    instances: IntArray
    power_kw: FloatArray
    pue: FloatArray  # per offer
    home: BoolArray
    work_gpu_h: FloatArray
    start_s: FloatArray
    deadline_s: FloatArray
    cold_start_h: FloatArray
    checkpoint_size_gb: FloatArray
    budget_usd: FloatArray  # inf where the job has no budget
    carbon_usd_per_tonne: FloatArray  # the job's own carbon price, NaN: the fleet's
    checkpoint_interval_h: FloatArray  # 0: every step is checkpointed (a preemption loses none)

    @staticmethod
    def build(jobs: Sequence[JobSpec], offers: Sequence[Offer]) -> JobOfferFit:
        n_j, n_o = len(jobs), len(offers)
        gpu_count = np.array([o.gpu_count for o in offers], dtype=np.int64)
        offer_power = np.array([o.power_kw for o in offers])
        gpus = np.array([job.gpus for job in jobs], dtype=np.int64).reshape(n_j, 1)
        inst = -(-gpus // gpu_count.reshape(1, n_o))
        power = offer_power.reshape(1, n_o) * inst
        # A job's rate depends on the offer only through its GPU type: compute it once per
        # (job, type), then spread it over the offers by type.
        types = sorted({o.gpu_type for o in offers})
        type_of = np.array([types.index(o.gpu_type) for o in offers], dtype=np.int64)
        by_type = np.zeros((n_j, len(types)))
        for j, job in enumerate(jobs):
            for t, gpu_type in enumerate(types):
                if job.allows(gpu_type):
                    by_type[j, t] = relative_throughput(job, gpu_type) * job.gpus
        rate = by_type[:, type_of].reshape(n_j, n_o)
        regions = sorted({o.region for o in offers} | {job.home_region for job in jobs})
        region_of = {r: i for i, r in enumerate(regions)}
        offer_region = np.array([region_of[o.region] for o in offers], dtype=np.int64)
        job_region = np.array([region_of[job.home_region] for job in jobs], dtype=np.int64)
        home = job_region.reshape(n_j, 1) == offer_region.reshape(1, n_o)
        return JobOfferFit(
            rate=rate,
            instances=inst,
            power_kw=power,
            pue=np.array([o.pue for o in offers]),
            home=home,
            work_gpu_h=np.array([job.work_gpu_hours for job in jobs], dtype=np.float64),
            start_s=np.array([job.start.timestamp() for job in jobs], dtype=np.float64),
            deadline_s=np.array([job.deadline.timestamp() for job in jobs], dtype=np.float64),
            cold_start_h=np.array([job.cold_start_h for job in jobs], dtype=np.float64),
            checkpoint_size_gb=np.array([job.checkpoint_size_gb for job in jobs], dtype=np.float64),
            budget_usd=np.array(
                [np.inf if job.budget_usd is None else job.budget_usd for job in jobs],
                dtype=np.float64,
            ),
            carbon_usd_per_tonne=np.array(
                [
                    np.nan if job.carbon_usd_per_tonne is None else job.carbon_usd_per_tonne
                    for job in jobs
                ],
                dtype=np.float64,
            ),
            checkpoint_interval_h=np.array(
                [job.checkpoint_interval_h for job in jobs], dtype=np.float64
            ),
        )

    def carbon_prices(self, js: IntArray, fleet_usd_per_tonne: float) -> FloatArray:
        """The carbon price of each job in `js` (USD/t): its own, else the fleet's."""
        own = self.carbon_usd_per_tonne[js]
        out: FloatArray = np.where(np.isnan(own), fleet_usd_per_tonne, own)
        return out


# -- energy, carbon and the objective ---------------------------------------------------------


def marginal_intensity(
    marginal_g_per_kwh: FloatArray, average_g_per_kwh: FloatArray, curtailing: BoolArray
) -> FloatArray:
    """Marginal rate where known; else 0 while curtailing, else the average (module doc)."""
    proxy = np.where(curtailing, 0.0, average_g_per_kwh)
    return np.where(np.isnan(marginal_g_per_kwh), proxy, marginal_g_per_kwh)


def carbon_usd(kwh: Num, g_co2_per_kwh: Num | float, usd_per_tonne: Num | float) -> Num:
    """What the emissions of `kwh` at `g_co2_per_kwh` cost at a carbon price (USD/t)."""
    return kwh * g_co2_per_kwh * usd_per_tonne / units.G_PER_TONNE


def objective_usd(usd: Num, kg_co2: Num | float, carbon_usd_per_tonne: Num | float) -> Num:
    """J: dollars plus the carbon price of the emissions (kgCO2)."""
    return usd + carbon_usd_per_tonne * kg_co2 / units.KG_PER_TONNE


# -- migration --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MoveCost:
    """What moving a job's checkpoint from `src` to `dst` costs before it runs again."""

    egress_usd: float
    transfer_h: float


def move_cost(
    job: JobSpec, src: Location | None, dst: Location, settings: CostSettings | None = None
) -> MoveCost:
    """Egress and transfer time for the job's checkpoint; nothing to move when `src` is None
    (no checkpoint yet) or it already sits in `dst`'s region."""
    if src is None:
        return MoveCost(0.0, 0.0)
    egress_pg, transfer_h_pg = per_gb(src, dst, settings or CostSettings())
    size = job.checkpoint_size_gb
    return MoveCost(egress_usd=size * egress_pg, transfer_h=size * transfer_h_pg)


def per_gb(src: Location, dst: Location, settings: CostSettings) -> tuple[float, float]:
    """(egress USD, transfer hours) per GB of a checkpoint copy from `src` to `dst`: none
    within one region (same cloud and region), else `egress_per_gb` and
    `transfer_h_per_gb`."""
    if src.cloud == dst.cloud and src.region == dst.region:
        return 0.0, 0.0
    return egress_per_gb(src, dst, settings), transfer_h_per_gb(src, dst, settings)


def move_matrices(offers: Sequence[Offer], settings: CostSettings) -> tuple[FloatArray, FloatArray]:
    """`per_gb` for every [src offer, dst offer] pair: egress USD per GB and transfer hours
    per GB, computed once per pair of regions."""
    regions: dict[tuple[str, str], int] = {}
    code = np.array(
        [regions.setdefault((o.cloud, o.region), len(regions)) for o in offers], dtype=np.int64
    )
    locs = [Location(c, r) for c, r in regions]
    n = len(locs)
    egress = np.zeros((n, n))
    transfer = np.zeros((n, n))
    for a, src in enumerate(locs):
        for b, dst in enumerate(locs):
            egress[a, b], transfer[a, b] = per_gb(src, dst, settings)
    return egress[np.ix_(code, code)], transfer[np.ix_(code, code)]


def egress_per_gb(src: Location, dst: Location, settings: CostSettings) -> float:
    """USD per GB of a checkpoint copy between two different regions."""
    if settings.egress_usd_per_gb is not None:
        return settings.egress_usd_per_gb
    return catalog.egress_usd_per_gb(src, dst)


def transfer_h_per_gb(src: Location, dst: Location, settings: CostSettings) -> float:
    """Hours per GB of a checkpoint copy between two different regions: 0 with transfer
    time off, at `settings.transfer_gbps` where set, else the catalog's route bandwidth."""
    if not settings.transfer_time:
        return 0.0
    if settings.transfer_gbps is not None:
        return units.hours(units.BITS_PER_BYTE / settings.transfer_gbps)
    return catalog.transfer_hours(1.0, src, dst)
