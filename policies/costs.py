"""The cost, energy, carbon and migration model every policy and the replay share.

DESIGN.md §4. Per job j on offer o:

- instances: ``ceil(gpus_j / gpu_count_o)``; a job never shares an instance.
- progress: ``tp[g(o)] * gpus_j`` reference GPU-hours per hour (reference: one A100-80GB),
  zero while the cold start (boot, restore, checkpoint transfer) runs.
- dollars: ``price_o * instances`` per hour, billed from launch (cold start included).
- energy: ``power_kw_o * instances * PUE * hours``; kgCO2 = kWh x intensity / 1000, both
  location-based (grid average) and marginal. Where a zone has no marginal signal the
  marginal rate is taken as the average, except while the zone curtails renewables, when the
  marginal kWh would otherwise be thrown away and counts 0 (Wiesner & Kao 2025 argue the
  average is a poor proxy there). Energy drawn while the zone curtails is also reported.
- migration: egress ``S_j * e(src -> dst)`` dollars and ``S_j / bandwidth`` hours of
  transfer, plus the cold start; a preemption also loses the work since the last checkpoint.
- objective: ``J = dollars + carbon_usd_per_tonne * kgCO2 / 1000``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator import catalog
from orchestrator.model import (
    BoolArray,
    CostSettings,
    FloatArray,
    IntArray,
    JobSpec,
    Location,
    Offer,
)


def relative_throughput(job: JobSpec, gpu_type: str) -> float:
    """Throughput of one GPU of `gpu_type` for this job, relative to one A100-80GB."""
    override = job.throughput.get(gpu_type)
    if override is not None:
        return float(override)
    return catalog.gpu(gpu_type).relative_throughput


def instances_needed(job: JobSpec, offer: Offer) -> int:
    return math.ceil(job.gpus / offer.gpu_count)


def progress_rate(job: JobSpec, offer: Offer) -> float:
    """Reference GPU-hours per hour once running; 0 where the job may not use the GPU."""
    if not job.allows(offer.gpu_type):
        return 0.0
    return relative_throughput(job, offer.gpu_type) * job.gpus


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
        )

    def carbon_prices(self, js: IntArray, fleet_usd_per_tonne: float) -> FloatArray:
        """The carbon price of each job in `js` (USD/t): its own, else the fleet's."""
        own = self.carbon_usd_per_tonne[js]
        out: FloatArray = np.where(np.isnan(own), fleet_usd_per_tonne, own)
        return out


def marginal_intensity(
    marginal_g_per_kwh: FloatArray, average_g_per_kwh: FloatArray, curtailing: BoolArray
) -> FloatArray:
    """Marginal rate where known; else 0 while curtailing, else the average (see module doc)."""
    proxy = np.where(curtailing, 0.0, average_g_per_kwh)
    return np.where(np.isnan(marginal_g_per_kwh), proxy, marginal_g_per_kwh)


def energy_kwh(
    power_kw: float | FloatArray, pue: float | FloatArray, hours: float | FloatArray
) -> FloatArray:
    return np.asarray(power_kw) * pue * hours


def kg_co2(kwh: float | FloatArray, g_co2_per_kwh: float | FloatArray) -> FloatArray:
    return np.asarray(kwh) * g_co2_per_kwh / 1000.0


def objective_usd(usd: float, kg: float, carbon_usd_per_tonne: float) -> float:
    return usd + carbon_usd_per_tonne * kg / 1000.0


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
    if src is None or (src.cloud == dst.cloud and src.region == dst.region):
        return MoveCost(0.0, 0.0)
    settings = settings or CostSettings()
    size = job.checkpoint_size_gb
    return MoveCost(
        egress_usd=size * egress_per_gb(src, dst, settings),
        transfer_h=size * transfer_h_per_gb(src, dst, settings),
    )


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
        return 8.0 / settings.transfer_gbps / 3600.0
    return catalog.transfer_hours(1.0, src, dst)


def lost_work_gpu_h(progress_gpu_h: float, checkpointed_gpu_h: float) -> float:
    """Work a preemption throws away: everything since the last checkpoint."""
    return max(0.0, progress_gpu_h - checkpointed_gpu_h)


def hours_to_finish(remaining_gpu_h: float, rate_gpu_h_per_h: float, cold_start_h: float) -> float:
    if rate_gpu_h_per_h <= 0:
        return math.inf
    return cold_start_h + max(0.0, remaining_gpu_h) / rate_gpu_h_per_h
