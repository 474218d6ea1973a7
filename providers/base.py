"""The compute-provider contract.

Contract (after Ray autoscaler v2's cloud instance provider):
- `launch` is idempotent per `request_id`: calling it twice with the same id returns the
  same instance and buys nothing more. Failures come back as data (`LaunchOutcome.error`),
  never as exceptions thrown into the loop.
- `terminate` and `list_instances` touch only instances this provider launched for the
  given cluster (tagged or labelled with it); anything else is invisible to them.
- `poll_events` returns what happened since the last call (preemption notices, capacity
  errors), as data, in time order. State is eventually consistent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol, cast

from orchestrator.model import InstanceId, JobId, Offer, OfferId


class Capability(StrEnum):
    """What an adapter can do beyond the contract's six methods, as `capabilities()` says.

    The optional methods are declared by the protocols below and reached through
    `priced`, `with_capacity`, `preemptible`, `acknowledging` and `with_logs` (never by
    `getattr`): an adapter that lists a capability has the method; one that does not is
    never asked.
    """

    SPOT = "spot"
    ON_DEMAND = "on_demand"
    PREEMPTION_NOTICE = "preemption_notice"
    CHECKPOINT_STORE = "checkpoint_store"
    PRICES = "prices"  # `quotes()`: USD per hour of its offers, with where each came from
    CAPACITY = "capacity"  # `capacity()`: instances of each offer obtainable now
    PREEMPT = "preempt"  # `preempt(id, notice_s)`: take an instance away (local, tests)
    ACKNOWLEDGE = "acknowledge"  # final events repeat until `acknowledge(events)` (local)
    LOGS = "logs"  # `console_output(id)`: the instance's console text so far (AWS, GCP)


class InstanceState(StrEnum):
    BOOTING = "booting"
    RUNNING = "running"
    TERMINATED = "terminated"
    PREEMPTED = "preempted"


class FailureKind(StrEnum):
    CAPACITY = "capacity"  # no capacity now; another zone or later may work
    QUOTA = "quota"  # account limit; needs a person
    AUTH = "auth"  # credentials or permissions; needs a person
    INVALID = "invalid"  # bad request (unknown offer, bad spec)
    TRANSIENT = "transient"  # throttling, timeouts; retry later


class Launcher(StrEnum):
    """How a node starts `LaunchSpec.entrypoint` (providers/gang.py)."""

    TORCHRUN = "torchrun"  # under torchrun, c10d rendezvous at rank 0 (the default)
    NONE = "none"  # as it is: the job starts its own processes


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """What to start: a gang of `count` instances of `offer_id` running `job_id`.

    `env` is passed to the job, with the gang's variables (providers/gang.py); `startup_s`
    is how long the job needs before it makes progress (boot, checkpoint transfer and
    restore); the simulated provider honours it, real ones take what they take.
    `launcher`: each node runs the entrypoint under torchrun unless it is `Launcher.NONE`.
    """

    job_id: JobId
    offer_id: OfferId
    cluster: str
    startup_s: float = 0.0
    count: int = 1  # instances in the job's gang, launched and preempted together
    entrypoint: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    launcher: Launcher = Launcher.TORCHRUN


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    id: InstanceId
    offer_id: OfferId
    job_id: JobId
    state: InstanceState
    launched_at_s: float
    ready_at_s: float


@dataclass(frozen=True, slots=True)
class ProviderFailure:
    kind: FailureKind
    message: str
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LaunchOutcome:
    instance_id: InstanceId | None
    ready_at_s: float = float("nan")
    error: ProviderFailure | None = None

    @property
    def ok(self) -> bool:
        return self.instance_id is not None


class EventType(StrEnum):
    PREEMPTED = "preempted"  # the instance was taken away (spot reclaim, local preempt)
    PREEMPTION_NOTICE = "preemption_notice"  # it will be taken away soon
    CAPACITY_UNAVAILABLE = "capacity_unavailable"
    COMPLETED = "completed"  # the job's process exited successfully: the work is done
    FAILED = "failed"  # the job's process exited with an error
    PROGRESS = "progress"  # the job reported progress; `value` is the fraction done (0..1)


@dataclass(frozen=True, slots=True)
class ProviderEvent:
    type: EventType
    instance_id: InstanceId
    job_id: JobId
    time_s: float
    detail: str = ""
    value: float = 0.0
    # PROGRESS: the fraction of the work its newest checkpoint holds, when the job says.
    checkpointed: float | None = None


class ComputeProvider(Protocol):
    name: str

    def capabilities(self) -> frozenset[Capability]: ...

    def offers(self) -> Sequence[Offer]: ...

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]: ...

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome: ...

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None: ...

    def poll_events(self) -> list[ProviderEvent]: ...


class Quote(NamedTuple):
    """The hourly price of one offer (whole instance, USD) and where it came from."""

    usd_per_hour: float
    source: str


class PricedProvider(ComputeProvider, Protocol):
    """`Capability.PRICES`: the adapter prices its offers."""

    def quotes(self) -> Mapping[OfferId, Quote]: ...


class CapacityProvider(ComputeProvider, Protocol):
    """`Capability.CAPACITY`: how many instances of each offer it can start now."""

    def capacity(self) -> Mapping[OfferId, int]: ...


class PreemptibleProvider(ComputeProvider, Protocol):
    """`Capability.PREEMPT`: it can take an instance away itself (with `notice_s` warning)."""

    def preempt(self, instance_id: InstanceId, notice_s: float = 2.0) -> bool: ...


def priced(provider: ComputeProvider) -> PricedProvider | None:
    """The provider as a `PricedProvider` when it lists `Capability.PRICES`, else None."""
    if Capability.PRICES in provider.capabilities():
        return cast(PricedProvider, provider)
    return None


def with_capacity(provider: ComputeProvider) -> CapacityProvider | None:
    if Capability.CAPACITY in provider.capabilities():
        return cast(CapacityProvider, provider)
    return None


def preemptible(provider: ComputeProvider) -> PreemptibleProvider | None:
    if Capability.PREEMPT in provider.capabilities():
        return cast(PreemptibleProvider, provider)
    return None


class AcknowledgingProvider(ComputeProvider, Protocol):
    """`Capability.ACKNOWLEDGE`: `poll_events` repeats an instance's final event (completed,
    failed, preempted) until the controller acknowledges it after committing it."""

    def acknowledge(self, events: Sequence[ProviderEvent]) -> None: ...


def acknowledging(provider: ComputeProvider) -> AcknowledgingProvider | None:
    if Capability.ACKNOWLEDGE in provider.capabilities():
        return cast(AcknowledgingProvider, provider)
    return None


class LogsProvider(ComputeProvider, Protocol):
    """`Capability.LOGS`: the console text of an instance it launched.

    `console_output(instance_id)` is what the instance wrote to its console so far (EC2
    console output, the GCE serial port 1), as the cloud keeps it: cumulative, the newest
    part when the cloud keeps only a window of it (EC2: the last 64 KB). For a gang, the
    text of its first node (rank 0, whose id is the gang's): the nodes' texts are not
    interleaved, so each read extends the last. "" when there is none yet. An id that is not
    an instance of the adapter's cluster raises `InputError` (nothing of another's is read);
    a failing cloud call raises `TransientError` or `PermanentError`.
    """

    def console_output(self, instance_id: InstanceId) -> str: ...


def with_logs(provider: ComputeProvider) -> LogsProvider | None:
    if Capability.LOGS in provider.capabilities():
        return cast(LogsProvider, provider)
    return None
