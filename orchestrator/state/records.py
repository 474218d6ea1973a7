"""Plain records the state store reads and writes, and their conversions.

Everything here is stdlib + the domain model: no SQLAlchemy, so a training script or a
policy test can use the records without a database driver installed.

- `JobRow`: one job's numbers (the columns of `FleetState` for one job), with offers named
  by id rather than by index, and `None` where `FleetState` holds NaN or -1.
- `LoadedFleet`: what `StateStore.load()` returns besides the version.
- `MigrationRecord`, `InstanceRecord`, `SignalSample`: one row each of their tables.
- `rows_from_fleet` / `fleet_from_rows`: between `FleetState` arrays and `JobRow`s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from orchestrator.errors import InputError, TransientError
from orchestrator.model import (
    FleetState,
    InstanceId,
    JobId,
    JobSpec,
    Offer,
    OfferId,
    Phase,
    SignalKind,
)

if TYPE_CHECKING:
    import pandas as pd

#: Migration phases after which a migration is no longer open (compared case-insensitively).
TERMINAL_MIGRATION_PHASES: Final = frozenset({"done", "failed"})

#: Columns of a samples frame given to `append_samples` (`valid_until` is optional).
SAMPLE_COLUMNS: Final = (
    "time",
    "key",
    "kind",
    "value",
    "unit",
    "source",
    "observed_at",
    "valid_until",
)


class VersionConflict(TransientError):
    """Another writer committed since the version this writer loaded.

    Reload (`StateStore.load()`), redo the decision on the fresh state, and commit again.
    """

    def __init__(
        self, message: str, *, expected: int | None = None, actual: int | None = None
    ) -> None:
        super().__init__(message, retry_after_s=0.0)
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job's row of `job_state`: the `FleetState` numbers of one job.

    Offers are named by id (`None`: none). Times are POSIX seconds (`None`: not set; NaN
    in `FleetState`). `instance_id` is the instance the job holds (`None`: none).
    `version` counts the commits that wrote this row; it is set by the store, ignored on
    write, and left out of `==`, so `new != old` means "the numbers changed".
    """

    phase: Phase = Phase.PENDING
    offer_id: OfferId | None = None
    checkpoint_offer_id: OfferId | None = None
    progress_gpu_h: float = 0.0
    checkpointed_gpu_h: float = 0.0
    last_checkpoint_s: float | None = None
    ready_at_s: float | None = None
    usd: float = 0.0
    kwh: float = 0.0
    kwh_curtailed: float = 0.0
    kg_co2: float = 0.0
    kg_co2_marginal: float = 0.0
    egress_usd: float = 0.0
    migrations: int = 0
    preemptions: int = 0
    launches: int = 0
    finished_at_s: float | None = None
    preempted_offer_id: OfferId | None = None
    instance_id: InstanceId | None = None
    version: int = field(default=0, compare=False)


#: JobRow fields that are stored as plain numbers (everything but phase, ids and version).
JOB_ROW_FLOATS: Final = (
    "progress_gpu_h",
    "checkpointed_gpu_h",
    "last_checkpoint_s",
    "ready_at_s",
    "usd",
    "kwh",
    "kwh_curtailed",
    "kg_co2",
    "kg_co2_marginal",
    "egress_usd",
    "finished_at_s",
)
JOB_ROW_INTS: Final = ("migrations", "preemptions", "launches")
JOB_ROW_IDS: Final = ("offer_id", "checkpoint_offer_id", "preempted_offer_id", "instance_id")


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationRecord:
    """One migration of one job, as the migration machine records it before and after each
    step. `phase` is the machine's phase name; a migration is open until its phase is one
    of `TERMINAL_MIGRATION_PHASES`. A job has at most one open migration."""

    id: str
    job_id: JobId
    phase: str
    src_offer_id: OfferId | None
    dst_offer_id: OfferId
    request_id: str
    checkpoint_uri: str | None = None
    error: str | None = None
    started_s: float
    updated_s: float
    detail: str | None = None  # the migration machine's full record (JSON), opaque here

    @property
    def is_open(self) -> bool:
        return self.phase.lower() not in TERMINAL_MIGRATION_PHASES


@dataclass(frozen=True, slots=True, kw_only=True)
class InstanceRecord:
    """An instance Heliotrope launched (or adopted). `request_id` is the idempotency key of
    the launch that created it: unique across instances."""

    id: InstanceId
    provider: str
    cluster: str
    job_id: JobId | None
    offer_id: OfferId
    state: str
    launched_at: datetime
    request_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalSample:
    """One observed signal value: `value` of `kind` for `key` (region, offer or grid zone)
    at `time`, as `source` reported it at `observed_at`; `valid_until` None: until the next
    sample. `value` NaN means unknown. Samples are unique per
    (kind, key, time, source, observed_at); appending one again is a no-op."""

    time: datetime
    key: str
    kind: SignalKind
    value: float
    unit: str
    source: str
    observed_at: datetime
    valid_until: datetime | None = None

    def identity(self) -> tuple[str, str, datetime, str, datetime]:
        return (self.kind.value, self.key, self.time, self.source, self.observed_at)


@dataclass(frozen=True, slots=True)
class LoadedFleet:
    """What `StateStore.load()` returns besides the version: the jobs in submission order,
    a row per job, the open migrations, and when each job was submitted and its status."""

    jobs: tuple[JobSpec, ...]
    rows: Mapping[JobId, JobRow]
    migrations: tuple[MigrationRecord, ...]
    submitted_at: Mapping[JobId, datetime]
    status: Mapping[JobId, str]
    accrued_until_s: float | None = None  # the fleet is accounted up to here (None: never)
    held_until_s: Mapping[JobId, float] = field(default_factory=dict)  # held jobs only


# -- conversions ----------------------------------------------------------------------------


def _opt(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def rows_from_fleet(
    jobs: Sequence[JobSpec],
    fleet: FleetState,
    offers: Sequence[Offer],
    instance_of: Sequence[InstanceId | None],
    indices: Iterable[int] | None = None,
) -> dict[JobId, JobRow]:
    """`JobRow`s for the jobs at `indices` (default all) of a fleet aligned with `jobs`.

    Pass only the rows that changed to `StateStore.commit`:
    ``{k: r for k, r in new.items() if r != old.get(k)}``.
    """

    def oid(k: int) -> OfferId | None:
        return offers[k].id if k >= 0 else None

    out: dict[JobId, JobRow] = {}
    for j in range(len(jobs)) if indices is None else indices:
        out[jobs[j].id] = JobRow(
            phase=Phase(int(fleet.phase[j])),
            offer_id=oid(int(fleet.offer[j])),
            checkpoint_offer_id=oid(int(fleet.checkpoint_offer[j])),
            progress_gpu_h=float(fleet.progress_gpu_h[j]),
            checkpointed_gpu_h=float(fleet.checkpointed_gpu_h[j]),
            last_checkpoint_s=_opt(fleet.last_checkpoint_s[j]),
            ready_at_s=_opt(fleet.ready_at_s[j]),
            usd=float(fleet.usd[j]),
            kwh=float(fleet.kwh[j]),
            kwh_curtailed=float(fleet.kwh_curtailed[j]),
            kg_co2=float(fleet.kg_co2[j]),
            kg_co2_marginal=float(fleet.kg_co2_marginal[j]),
            egress_usd=float(fleet.egress_usd[j]),
            migrations=int(fleet.migrations[j]),
            preemptions=int(fleet.preemptions[j]),
            launches=int(fleet.launches[j]),
            finished_at_s=_opt(fleet.finished_at_s[j]),
            preempted_offer_id=oid(int(fleet.preempted_offer[j])),
            instance_id=instance_of[j] or None,
        )
    return out


def fleet_from_rows(
    jobs: Sequence[JobSpec],
    rows: Mapping[JobId, JobRow],
    offers: Sequence[Offer],
) -> tuple[FleetState, list[InstanceId | None]]:
    """A writable `FleetState` aligned with `jobs`, and the instance each job holds.

    Jobs without a row start empty. An offer id not in `offers` raises `InputError`: the job
    would otherwise silently lose the instance or checkpoint it holds.
    """
    fleet = FleetState.empty(len(jobs))
    instance_of: list[InstanceId | None] = [None] * len(jobs)
    index = {o.id: k for k, o in enumerate(offers)}

    def ix(job: JobId, what: str, offer_id: OfferId | None) -> int:
        if offer_id is None:
            return -1
        k = index.get(offer_id)
        if k is None:
            raise InputError(
                "state store",
                f"job {job}: {what}",
                "an offer in the current offer list",
                got=repr(offer_id),
                fix="load the fleet with the offers it was committed with",
            )
        return k

    for j, job in enumerate(jobs):
        row = rows.get(job.id)
        if row is None:
            continue
        fleet.phase[j] = int(row.phase)
        fleet.offer[j] = ix(job.id, "offer_id", row.offer_id)
        fleet.checkpoint_offer[j] = ix(job.id, "checkpoint_offer_id", row.checkpoint_offer_id)
        fleet.preempted_offer[j] = ix(job.id, "preempted_offer_id", row.preempted_offer_id)
        for name in JOB_ROW_FLOATS:
            getattr(fleet, name)[j] = _nan(getattr(row, name))
        for name in JOB_ROW_INTS:
            getattr(fleet, name)[j] = int(getattr(row, name))
        instance_of[j] = row.instance_id
    return fleet, instance_of


# -- samples ----------------------------------------------------------------------------------


def _is_missing(x: object) -> bool:
    if x is None:
        return True
    if isinstance(x, float) and math.isnan(x):
        return True
    return type(x).__name__ == "NaTType"


def as_utc(value: object, field: str, where: str = "signal samples") -> datetime:
    """A tz-aware UTC datetime from a datetime or pandas Timestamp (naive taken as UTC)."""
    to_py = getattr(value, "to_pydatetime", None)
    if to_py is not None:
        value = to_py()
    if not isinstance(value, datetime):
        raise InputError(where, field, "a datetime", got=repr(value))
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def iter_samples(rows: Any) -> Iterator[SignalSample]:
    """Samples from a frame (columns `SAMPLE_COLUMNS`, `valid_until` optional) or from an
    iterable of `SignalSample`; every time made tz-aware UTC, `kind` checked."""
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):
        missing = [c for c in SAMPLE_COLUMNS[:-1] if c not in rows.columns]
        if missing:
            raise InputError(
                "signal samples",
                "columns",
                ", ".join(SAMPLE_COLUMNS[:-1]),
                got=f"missing {', '.join(missing)}",
            )
        records: Iterable[Any] = rows.to_dict("records")
    else:
        records = rows
    for n, item in enumerate(records):
        r = (
            {name: getattr(item, name) for name in SAMPLE_COLUMNS}
            if isinstance(item, SignalSample)
            else item
        )
        try:
            kind = SignalKind(r["kind"])
        except ValueError:
            raise InputError(
                "signal samples",
                f"row {n}: kind",
                "one of " + ", ".join(k.value for k in SignalKind),
                got=repr(r["kind"]),
            ) from None
        valid_until = r.get("valid_until")
        value = r["value"]
        yield SignalSample(
            time=as_utc(r["time"], f"row {n}: time"),
            key=str(r["key"]),
            kind=kind,
            value=math.nan if _is_missing(value) else float(value),
            unit=str(r["unit"]),
            source=str(r["source"]),
            observed_at=as_utc(r["observed_at"], f"row {n}: observed_at"),
            valid_until=None
            if _is_missing(valid_until)
            else as_utc(valid_until, f"row {n}: valid_until"),
        )


def sample_sort_key(s: SignalSample) -> tuple[datetime, str, str, datetime]:
    """The order `samples()` returns: time, key, source, observed_at."""
    return (s.time, s.key, s.source, s.observed_at)


def samples_to_frame(samples: Sequence[SignalSample]) -> pd.DataFrame:
    """The samples as a frame in the `SignalSource.read` shape (plus `valid_until`)."""
    import pandas as pd

    frame = pd.DataFrame(
        [{name: getattr(s, name) for name in SAMPLE_COLUMNS} for s in samples],
        columns=list(SAMPLE_COLUMNS),
    )
    for col in ("time", "observed_at", "valid_until"):
        frame[col] = pd.to_datetime(frame[col], utc=True)
    frame["kind"] = frame["kind"].astype(str)
    return frame


def encode_event_data(data: Mapping[str, float]) -> dict[str, float | str]:
    """Event data as JSON-safe values: non-finite floats become strings ('nan', 'inf')."""
    return {k: (float(v) if math.isfinite(v) else str(float(v))) for k, v in data.items()}


def decode_event_data(data: Mapping[str, Any] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (data or {}).items()}
