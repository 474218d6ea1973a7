"""The simulated provider: instances, capacity and preemptions driven by a signal grid.

Replay and the loop tests use it in place of a cloud. Spot capacity comes from the realized
availability matrix (the trace where it says something, a seeded hazard where it does not,
see `realize_spot`); on-demand is always available; a launch becomes ready after its
`startup_s`. Preemptions happen at tick boundaries: a spot gang runs in tick k only if the
capacity at k still covers it (SkyNomad's and Can't Be Late's convention).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from orchestrator import units
from orchestrator.clock import Clock
from orchestrator.model import InstanceId, Market, Offer
from orchestrator.signals.grid import SignalGrid
from providers.base import (
    Capability,
    EventType,
    FailureKind,
    InstanceInfo,
    InstanceState,
    LaunchOutcome,
    LaunchSpec,
    ProviderEvent,
    ProviderFailure,
)

# Fallback hazard for spot offers whose trace says nothing. Calibrated on the Can't Be Late
# V100 availability traces (Wu et al., NSDI'24; skypilot-org/spot-traces, 2023-02-15, 9 AWS
# zones): mean availability 17-60 % and outages of hours. We take 10 %/h of going away and
# 15 %/h of coming back (stationary availability 60 %), with 8 instances when available.
DEFAULT_LOSS_PER_HOUR = 0.10
DEFAULT_RETURN_PER_HOUR = 0.15
DEFAULT_CAPACITY = 8.0


def realize_spot(
    grid: SignalGrid,
    seed: int,
    *,
    loss_per_hour: float = DEFAULT_LOSS_PER_HOUR,
    return_per_hour: float = DEFAULT_RETURN_PER_HOUR,
    capacity: float = DEFAULT_CAPACITY,
) -> SignalGrid:
    """The grid with every unknown (NaN) spot capacity filled by a seeded two-state chain.

    Each spot offer gets its own stream (seeded by seed and offer id), so adding an offer
    does not change the others' realization.
    """
    cap = grid.spot_capacity.copy()
    dt_h = grid.tick_s / 3600.0
    p_loss = 1.0 - math.exp(-loss_per_hour * dt_h)
    p_return = 1.0 - math.exp(-return_per_hour * dt_h)
    for j, offer in enumerate(grid.offers):
        col = cap[:, j]
        unknown = np.isnan(col)
        if offer.market is not Market.SPOT or not unknown.any():
            continue
        rng = np.random.default_rng([seed, _stable_hash(offer.id)])
        u = rng.random(len(col))
        state = np.empty(len(col), dtype=bool)
        up = rng.random() < return_per_hour / (loss_per_hour + return_per_hour)
        for k in range(len(col)):
            up = (u[k] >= p_loss) if up else (u[k] < p_return)
            state[k] = up
        col[unknown] = np.where(state[unknown], capacity, 0.0)
    return dataclasses.replace(grid, spot_capacity=cap)


def _stable_hash(text: str) -> int:
    value = 0
    for ch in text.encode():
        value = (value * 131 + ch) % (2**31 - 1)
    return value


class SimProvider:
    """A provider over a `SignalGrid`; the clock decides which tick is now."""

    name = "sim"

    def __init__(self, grid: SignalGrid, clock: Clock, *, cluster: str = "replay") -> None:
        self._grid = grid
        self._clock = clock
        self._cluster = cluster
        self._offer_index = {o.id: k for k, o in enumerate(grid.offers)}
        self._start_s, self._n_ticks = grid.start_s, grid.n_ticks  # read per call
        self._instances: dict[InstanceId, InstanceInfo] = {}
        self._count: dict[InstanceId, int] = {}
        self._by_request: dict[str, LaunchOutcome] = {}
        # offer -> live spot instances, oldest first (a dict: an end removes in O(1)), and
        # how many instances they hold
        self._spot_held: dict[int, dict[InstanceId, None]] = {}
        self._spot_count: dict[int, int] = {}
        self._events: list[ProviderEvent] = []
        self._seq = 0

    # -- contract -------------------------------------------------------------------------
    def capabilities(self) -> frozenset[Capability]:
        return frozenset({Capability.SPOT, Capability.ON_DEMAND})

    def offers(self) -> Sequence[Offer]:
        return self._grid.offers

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        if cluster != self._cluster:
            return {}
        return {
            i: info
            for i, info in self._instances.items()
            if info.state in (InstanceState.BOOTING, InstanceState.RUNNING)
        }

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        if request_id in self._by_request:
            return self._by_request[request_id]
        k = self._offer_index.get(spec.offer_id)
        if k is None:
            return LaunchOutcome(
                None, error=ProviderFailure(FailureKind.INVALID, f"unknown offer {spec.offer_id!r}")
            )
        now_s = self._clock.now().timestamp()
        tick = self._tick(now_s)
        offer = self._grid.offers[k]
        if math.isnan(self._grid.usd_per_hour[tick, k]):
            return LaunchOutcome(
                None,
                error=ProviderFailure(FailureKind.CAPACITY, f"{spec.offer_id} is not sold now"),
            )
        if offer.market is Market.SPOT:
            free = self._grid.spot_capacity[tick, k] - self._held(k)
            if not free >= spec.count:  # NaN compares False: unknown is not capacity
                outcome = LaunchOutcome(
                    None,
                    error=ProviderFailure(
                        FailureKind.CAPACITY, f"no spot capacity for {spec.count} x {spec.offer_id}"
                    ),
                )
                self._by_request[request_id] = outcome
                return outcome
        self._seq += 1
        instance_id = f"sim-{self._seq:06d}"
        ready_at_s = now_s + spec.startup_s
        self._instances[instance_id] = InstanceInfo(
            id=instance_id,
            offer_id=spec.offer_id,
            job_id=spec.job_id,
            state=InstanceState.BOOTING,
            launched_at_s=now_s,
            ready_at_s=ready_at_s,
        )
        self._count[instance_id] = spec.count
        if offer.market is Market.SPOT:
            self._spot_held.setdefault(k, {})[instance_id] = None
            self._spot_count[k] = self._held(k) + spec.count
        outcome = LaunchOutcome(instance_id, ready_at_s=ready_at_s)
        self._by_request[request_id] = outcome
        return outcome

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        for instance_id in ids:
            info = self._instances.get(instance_id)
            if info is None or info.state in (InstanceState.TERMINATED, InstanceState.PREEMPTED):
                continue  # not ours, or already gone: terminate is idempotent
            self._end(instance_id, InstanceState.TERMINATED)

    def poll_events(self) -> list[ProviderEvent]:
        now_s = self._clock.now().timestamp()
        tick = self._tick(now_s)
        held_offers = [k for k, held in self._spot_held.items() if held]
        row = self._grid.spot_capacity[tick].tolist() if held_offers else []  # Python floats
        for k in held_offers:
            capacity = row[k]
            held = self._spot_held[k]
            while held and not self._held(k) <= capacity:
                victim = next(reversed(held))  # the newest gang goes first
                info = self._instances[victim]
                self._end(victim, InstanceState.PREEMPTED)
                self._events.append(
                    ProviderEvent(
                        EventType.PREEMPTED,
                        victim,
                        info.job_id,
                        now_s,
                        f"spot capacity {capacity:g} at {info.offer_id}",
                    )
                )
        events, self._events = self._events, []
        return events

    # -- internals -------------------------------------------------------------------------
    def _tick(self, now_s: float) -> int:
        k = units.tick_at(now_s, self._start_s, self._grid.tick_s)
        return min(max(k, 0), self._n_ticks - 1)

    def _held(self, k: int) -> int:
        """Instances the live spot gangs on offer `k` hold."""
        return self._spot_count.get(k, 0)

    def _end(self, instance_id: InstanceId, state: InstanceState) -> None:
        info = self._instances[instance_id]
        # The constructor, not `dataclasses.replace` (a third of the time; every end of an
        # instance comes here).
        self._instances[instance_id] = InstanceInfo(
            info.id, info.offer_id, info.job_id, state, info.launched_at_s, info.ready_at_s
        )
        k = self._offer_index[info.offer_id]
        held = self._spot_held.get(k)
        if held and instance_id in held:
            del held[instance_id]
            self._spot_count[k] -= self._count[instance_id]
