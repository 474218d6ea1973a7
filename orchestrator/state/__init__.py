"""The state store: jobs, per-job numbers, instances, migrations, events and signal samples.

Two implementations of one contract (`StateStore`):

- `open_store(url)` -> `SqlStateStore` (SQLAlchemy): SQLite by default
  (``~/.heliotrope/heliotrope.db``, WAL, 30 s busy timeout), PostgreSQL with a
  ``postgresql://`` URL; $HELIOTROPE_DB_URL picks the URL. It upgrades the schema (Alembic,
  shipped in ``migrations/``) to head when it opens.
- `MemoryStateStore`: the same behaviour in memory, for tests of other modules.

A controller uses it like this::

    fleet, version = store.load()              # jobs, JobRow per job, open migrations
    ... run a tick ...
    try:
        version = store.commit(events, changed_rows, expected_version=version)
    except VersionConflict:                    # another writer committed since `load`
        fleet, version = store.load()          # reload, decide again

`rows_from_fleet` / `fleet_from_rows` convert between `FleetState` arrays and `JobRow`s.
Importing this package does not import SQLAlchemy (`open_store` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.model import Event, JobId, JobSpec, SignalKind
from orchestrator.state.checks import UNSET, Unset
from orchestrator.state.memory import MemoryJobClaim, MemoryStateStore
from orchestrator.state.records import (
    SAMPLE_COLUMNS,
    TERMINAL_MIGRATION_PHASES,
    InstanceRecord,
    JobRow,
    LoadedFleet,
    MigrationRecord,
    SignalSample,
    VersionConflict,
    fleet_from_rows,
    rows_from_fleet,
    samples_to_frame,
)

if TYPE_CHECKING:
    from orchestrator.clock import Clock
    from orchestrator.state.sql import SqlStateStore


class JobClaim(Protocol):
    """Jobs one worker holds for a while (`StateStore.claim_jobs`).

    `rows` are the claimed jobs' rows (submission order) with their versions. `commit`
    writes events and rows for claimed jobs only, checks that none of them changed since the
    claim (else `VersionConflict`), bumps the fleet version and ends the claim.
    """

    @property
    def rows(self) -> Mapping[JobId, JobRow]: ...

    @property
    def job_ids(self) -> tuple[JobId, ...]: ...

    def commit(self, events: Sequence[Event], rows: Mapping[JobId, JobRow]) -> int: ...


class StateStore(Protocol):
    """Where the fleet lives between ticks. Errors: `InputError` for an unknown or
    duplicate job (nothing written), `VersionConflict` (a `TransientError`) when another
    writer got there first, `TransientError` when the database is busy or unreachable."""

    def submit(self, jobs: Sequence[JobSpec]) -> None:
        """Add jobs (each with an empty `JobRow`). A job id already submitted, or twice in
        `jobs`, raises `InputError` and nothing is written. Does not bump the version."""
        ...

    def version(self) -> int:
        """The fleet version: how many commits there have been."""
        ...

    def load(self) -> tuple[LoadedFleet, int]:
        """Every job (submission order), its row, the open migrations, and the version, all
        from one consistent snapshot."""
        ...

    def commit(
        self,
        events: Sequence[Event],
        rows: Mapping[JobId, JobRow],
        *,
        expected_version: int,
        migrations: Sequence[MigrationRecord] = (),
        accrued_until_s: float | None = None,
    ) -> int:
        """Atomically append `events`, write `rows` (pass only changed ones; each written
        row's version goes up by one), save `migrations`, record until when the fleet is
        accrued (`accrued_until_s`, when given; `load` returns it), and bump the fleet
        version from `expected_version`; return the new version. `VersionConflict` if the
        version is no longer `expected_version` (nothing written)."""
        ...

    def set_control(
        self,
        job_id: JobId,
        *,
        status: str | None = None,
        held_until_s: float | Unset | None = UNSET,
    ) -> int:
        """What an operator decided about a job: its `status` (``active`` | ``cancelled``)
        and until when it is held where it runs (`held_until_s`, seconds since the epoch;
        ``math.inf`` until released; None: not held; left out: unchanged). Bumps the fleet
        version, so running controllers reload; returns it. Unknown job: `InputError`."""
        ...

    def claim_jobs(self, n: int) -> AbstractContextManager[JobClaim]:
        """Claim up to `n` unfinished jobs in submission order until the block ends or the
        claim commits. PostgreSQL locks them (``FOR UPDATE SKIP LOCKED``: concurrent claims
        get disjoint jobs; the memory store does the same); SQLite does not lock (claims may
        overlap) and relies on the version check at `JobClaim.commit`. On PostgreSQL do not
        `commit()` rows of claimed jobs inside the block: they are locked."""
        ...

    def history(self, job_id: JobId) -> list[Event]:
        """The job's events in commit order. Unknown job: `InputError`."""
        ...

    def events(
        self, *, since_id: int = 0, job_id: JobId | None = None, limit: int = 1000
    ) -> list[tuple[int, Event]]:
        """(event id, event) with id > `since_id`, in commit order, at most `limit`."""
        ...

    def record_instance(self, instance: InstanceRecord) -> None:
        """Insert or update (by id) an instance. A request id names one instance: the same
        id with another request id, or the reverse, raises `PermanentError`."""
        ...

    def instances(self, cluster: str, *, job_id: JobId | None = None) -> list[InstanceRecord]:
        """Instances of `cluster` (and `job_id`), by launch time."""
        ...

    def save_migration(self, migration: MigrationRecord) -> None:
        """Insert or update (by id). A second open migration for a job: `VersionConflict`."""
        ...

    def open_migrations(self, job_id: JobId | None = None) -> list[MigrationRecord]:
        """Migrations not in a terminal phase, by start time."""
        ...

    def append_samples(self, rows: Any) -> None:
        """Append signal samples: a frame with `SAMPLE_COLUMNS` (``valid_until`` optional)
        or `SignalSample`s. A sample already stored (same kind, key, time, source,
        observed_at) is skipped."""
        ...

    def samples(
        self, kind: SignalKind, keys: Sequence[str] | None, start_s: float, end_s: float
    ) -> list[SignalSample]:
        """Samples of `kind` for `keys` (None: all) with start_s <= time < end_s, ordered by
        time, key, source, observed_at."""
        ...

    def observed_samples(self, start_s: float, end_s: float) -> list[SignalSample]:
        """Samples of every kind observed in start_s <= observed_at < end_s, by observation
        (what a live view learns between two ticks)."""
        ...

    def close(self) -> None: ...


def open_store(url: str | None = None, *, clock: Clock | None = None) -> SqlStateStore:
    """Open the SQL store at `url` (default $HELIOTROPE_DB_URL, else
    ``sqlite:///~/.heliotrope/heliotrope.db``), upgrading its schema first."""
    from orchestrator.state.sql import open_store as _open

    return _open(url, clock=clock)


def upgrade(url: str | None = None) -> None:
    """Bring the database at `url` to the newest schema (idempotent)."""
    from orchestrator.state.sql import upgrade as _upgrade

    _upgrade(url)


__all__ = [
    "SAMPLE_COLUMNS",
    "TERMINAL_MIGRATION_PHASES",
    "InstanceRecord",
    "JobClaim",
    "JobRow",
    "LoadedFleet",
    "MemoryJobClaim",
    "MemoryStateStore",
    "MigrationRecord",
    "SignalSample",
    "StateStore",
    "VersionConflict",
    "fleet_from_rows",
    "open_store",
    "rows_from_fleet",
    "samples_to_frame",
    "upgrade",
]
