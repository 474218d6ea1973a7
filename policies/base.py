"""The policy contract: a `Snapshot` in, a `Decision` out.

The snapshot is built by the loop (`orchestrator.loop.Controller`) and holds only what a
policy may look at; the static job x offer facts come from the shared cost model
(`orchestrator.costs.JobOfferFit`) and the past signals through `SignalRows`, which the
loop's `orchestrator.signals.history.SignalHistory` implements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from orchestrator.costs import JobOfferFit
from orchestrator.model import (
    BoolArray,
    CostSettings,
    Decision,
    FleetState,
    FloatArray,
    JobSpec,
    Offer,
)


class SignalRows(Protocol):
    """The signal rows of the last `lookback` ticks up to and including now, oldest first,
    columns in `Snapshot.offers` order (read-only views; never a row after now)."""

    def usd_per_hour(self, lookback: int) -> FloatArray: ...
    def spot_capacity(self, lookback: int) -> FloatArray: ...
    def carbon_g_per_kwh(self, lookback: int) -> FloatArray: ...
    def carbon_marginal_g_per_kwh(self, lookback: int) -> FloatArray: ...
    def curtailing(self, lookback: int) -> FloatArray: ...


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may look at, frozen at `now`.

    Per-offer arrays align with `offers`; per-job arrays (in `fleet`) align with `jobs`.
    `spot_capacity` is how many more instances of a spot offer could be launched now
    (`inf` for on-demand, 0 where spot is unavailable, NaN where unknown): the reported
    capacity less what the fleet holds there, so it is negative where the fleet holds
    more than is reported (no free slot; the oracle adds the fleet's back to read the
    capacity itself).
    `carbon_marginal_g_per_kwh` is NaN where no marginal signal exists.
    `fit` holds the static job x offer facts (progress rate, instances, power).
    `history` gives signals strictly up to `now` (for forecasts); it cannot see the future.
    """

    now: datetime
    now_s: float
    tick_h: float
    offers: Sequence[Offer]
    usd_per_hour: FloatArray
    spot_capacity: FloatArray
    carbon_g_per_kwh: FloatArray
    carbon_marginal_g_per_kwh: FloatArray
    curtailing: BoolArray
    jobs: Sequence[JobSpec]
    fleet: FleetState
    fit: JobOfferFit
    settings: CostSettings = field(default_factory=CostSettings)
    history: SignalRows | None = None

    @property
    def carbon_usd_per_tonne(self) -> float:
        return self.settings.carbon_usd_per_tonne


class Policy(Protocol):
    """Decide, for each job, where it should run now.

    Contract: pure (same snapshot, same decision); no I/O, no clock, no randomness that is
    not seeded from the snapshot; jobs left out of the decision keep what they have. The
    planner enforces feasibility (capacity, GPU type), so a policy may be optimistic.
    """

    name: str

    def __call__(self, snapshot: Snapshot) -> Decision: ...
