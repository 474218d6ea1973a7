"""The domain model: plain frozen data shared by the loop, the policies and the providers.

Per-job numbers that change every tick (progress, dollars, energy) live in `FleetState`, a
struct of numpy arrays indexed like the job list, so a replay of hundreds of jobs over
thousands of ticks stays fast. Everything else is a frozen, slotted dataclass.

Work is measured in reference GPU-hours: hours of one A100-80GB. A job with `gpus` GPUs on
an offer whose GPU type has relative throughput `tp` progresses `tp * gpus` reference
GPU-hours per hour once its cold start is over.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum, StrEnum
from operator import attrgetter

import numpy as np
import numpy.typing as npt

JobId = str
OfferId = str
InstanceId = str

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


class Market(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on_demand"


class SignalKind(StrEnum):
    PRICE = "price"
    SPOT_AVAILABILITY = "spot_availability"
    CARBON = "carbon"
    CURTAILMENT = "curtailment"
    POWER_PRICE = "power_price"


@dataclass(frozen=True, slots=True)
class Location:
    """Where data or compute lives: a cloud region (and zone, when known)."""

    cloud: str
    region: str
    zone: str = ""


@dataclass(frozen=True, slots=True)
class Offer:
    """Something that can be bought: an instance type in a zone, on one market.

    `power_kw` is the IT power of one instance under load (GPUs plus host); `pue` the
    facility overhead of the cloud; `grid_zone` the electricity zone it draws from.
    """

    id: OfferId
    cloud: str
    region: str
    zone: str
    instance_type: str
    gpu_type: str
    gpu_count: int
    market: Market
    grid_zone: str
    power_kw: float
    pue: float

    @property
    def location(self) -> Location:
        return Location(self.cloud, self.region, self.zone)

    @staticmethod
    def make_id(cloud: str, zone: str, instance_type: str, market: Market) -> OfferId:
        return f"{cloud}:{zone}:{instance_type}:{market.value}"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a person asked for. Immutable for the life of the job.

    `throughput` overrides the catalog's relative throughput per GPU type for this job;
    `gpu_types` empty means any GPU type is allowed. `checkpoint_interval_h` is how often the
    job checkpoints while running (0: continuously, so a preemption loses nothing).
    """

    id: JobId
    work_gpu_hours: float
    gpus: int
    start: datetime
    deadline: datetime
    checkpoint_size_gb: float
    cold_start_h: float
    home_region: str
    gpu_types: frozenset[str] = frozenset()
    throughput: Mapping[str, float] = field(default_factory=dict)
    budget_usd: float | None = None
    checkpoint_interval_h: float = 1.0
    command: tuple[str, ...] = ()  # what a live instance runs (replay ignores it)
    carbon_usd_per_tonne: float | None = None  # this job's carbon price (None: the fleet's)
    launcher: str = "torchrun"  # torchrun: each node runs `command` under torchrun; none: as is

    def allows(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types


class Phase(IntEnum):
    """Where a job is in its life. Stored as int8 in `FleetState.phase`."""

    PENDING = 0  # before its start time
    WAITING = 1  # started, holds no instance (never launched, paused or preempted)
    STARTING = 2  # instance launched, cold start (boot + restore + transfer) not over
    RUNNING = 3  # making progress
    DONE = 4  # work complete; its instance is released


@dataclass(frozen=True, slots=True)
class FleetState:
    """Per-job numbers, one array element per job in `Snapshot.jobs` order.

    Read-only in a snapshot (arrays are copies with the write flag off).
    `offer` is the index into `Snapshot.offers` of the job's instance, -1 for none;
    `checkpoint_offer` the offer index where its newest checkpoint was written (-1: none yet);
    `ready_at_s` when the current instance's cold start ends (POSIX seconds, NaN: none).
    """

    phase: npt.NDArray[np.int8]
    offer: IntArray
    checkpoint_offer: IntArray
    progress_gpu_h: FloatArray
    checkpointed_gpu_h: FloatArray
    last_checkpoint_s: FloatArray
    ready_at_s: FloatArray
    usd: FloatArray
    kwh: FloatArray
    kwh_curtailed: FloatArray
    kg_co2: FloatArray
    kg_co2_marginal: FloatArray
    egress_usd: FloatArray
    migrations: IntArray
    preemptions: IntArray
    launches: IntArray
    finished_at_s: FloatArray
    preempted_offer: IntArray  # offer of the most recent preemption, -1 none

    @staticmethod
    def empty(n_jobs: int) -> FleetState:
        def f(fill: float) -> FloatArray:
            return np.full(n_jobs, fill, dtype=np.float64)

        def i(fill: int) -> IntArray:
            return np.full(n_jobs, fill, dtype=np.int64)

        return FleetState(
            phase=np.zeros(n_jobs, dtype=np.int8),
            offer=i(-1),
            checkpoint_offer=i(-1),
            progress_gpu_h=f(0.0),
            checkpointed_gpu_h=f(0.0),
            last_checkpoint_s=f(math.nan),
            ready_at_s=f(math.nan),
            usd=f(0.0),
            kwh=f(0.0),
            kwh_curtailed=f(0.0),
            kg_co2=f(0.0),
            kg_co2_marginal=f(0.0),
            egress_usd=f(0.0),
            migrations=i(0),
            preemptions=i(0),
            launches=i(0),
            finished_at_s=f(math.nan),
            preempted_offer=i(-1),
        )

    def frozen_copy(self) -> FleetState:
        copies = [a.copy() for a in _fleet_arrays(self)]
        for c in copies:
            c.setflags(write=False)
        return FleetState(*copies)


_fleet_arrays = attrgetter(*FleetState.__dataclass_fields__)  # every field, in order


@dataclass(frozen=True, slots=True)
class CostSettings:
    """How the world charges: shared by the policy (to predict) and the loop (to account).

    `egress_usd_per_gb` overrides the catalog's per-route prices for every cross-region
    move (a benchmark setting); `transfer_time` off makes checkpoint copies instant;
    `transfer_gbps` overrides the catalog's per-route bandwidth for every cross-region copy;
    `bill_final_tick` bills the whole tick in which a job finishes.
    """

    carbon_usd_per_tonne: float = 0.0
    egress_usd_per_gb: float | None = None
    transfer_time: bool = True
    bill_final_tick: bool = False
    transfer_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class Intent:
    """A policy's wish for one job: run on `offer` (an index into `Snapshot.offers`), or
    pause when `offer` is None. Running on a different offer than now is a migration."""

    offer: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Decision:
    """Per-job intents, keyed by job index. Jobs not named keep what they have."""

    intents: Mapping[int, Intent] = field(default_factory=dict)


class ActionKind(StrEnum):
    LAUNCH = "launch"
    TERMINATE = "terminate"


@dataclass(frozen=True, slots=True)
class Action:
    """One side effect the executor performs, idempotent by `request_id`."""

    kind: ActionKind
    job: int
    offer: int
    request_id: str
    reason: str = ""


class EventKind(StrEnum):
    LAUNCHED = "launched"
    READY = "ready"
    TERMINATED = "terminated"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    REJECTED = "rejected"  # an intent the planner refused, or a launch the provider refused
    MIGRATION = "migration"  # a live migration changed phase (detail: from -> to)
    HELD = "held"  # the controller decided nothing: its signals are stale (detail: why)


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened to a job, as recorded in the state store."""

    time_s: float
    job_id: JobId
    kind: EventKind
    offer_id: OfferId = ""
    detail: str = ""
    data: Mapping[str, float] = field(default_factory=dict)
    instance_id: InstanceId = ""
