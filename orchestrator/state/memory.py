"""`MemoryStateStore`: the state store contract in memory, for tests of other modules.

It behaves like the SQL store (same errors, same ordering, same normalisation of what it
gives back: UTC times, NaN as None in rows), and `claim_jobs` skips jobs another claim
holds, as PostgreSQL's ``FOR UPDATE SKIP LOCKED`` does. Thread-safe; one process only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from orchestrator.clock import Clock, SystemClock
from orchestrator.model import Event, JobId, JobSpec, Phase, SignalKind
from orchestrator.state.checks import (
    UNSET,
    Unset,
    check_claimed,
    check_control,
    check_migrations,
    check_unique,
    duplicate_jobs,
    from_s,
    instance_clash,
    normalize_event,
    normalize_job,
    normalize_row,
    open_migration_conflict,
    unknown_jobs,
)
from orchestrator.state.records import (
    InstanceRecord,
    JobRow,
    LoadedFleet,
    MigrationRecord,
    SignalSample,
    VersionConflict,
    as_utc,
    iter_samples,
    sample_sort_key,
)


class MemoryStateStore:
    """`StateStore` in memory."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.RLock()
        self._jobs: dict[JobId, JobSpec] = {}  # insertion order = submission order
        self._submitted_at: dict[JobId, Any] = {}
        self._rows: dict[JobId, JobRow] = {}
        self._events: list[Event] = []  # event id = index + 1
        self._instances: dict[str, InstanceRecord] = {}
        self._migrations: dict[str, MigrationRecord] = {}
        self._samples: dict[tuple[Any, ...], SignalSample] = {}
        self._version = 0
        self._accrued_until_s: float | None = None
        self._claimed: set[JobId] = set()
        self._status: dict[JobId, str] = {}
        self._held_until_s: dict[JobId, float] = {}

    def __repr__(self) -> str:
        return f"MemoryStateStore({len(self._jobs)} jobs, version {self._version})"

    def close(self) -> None:
        pass

    def __enter__(self) -> MemoryStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs and fleet -----------------------------------------------------------------
    def submit(self, jobs: Sequence[JobSpec]) -> None:
        ids = [j.id for j in jobs]
        check_unique(ids)
        normalized = [normalize_job(j) for j in jobs]
        now = as_utc(self.clock.now(), "now", "clock")
        with self._lock:
            taken = sorted(i for i in ids if i in self._jobs)
            if taken:
                raise duplicate_jobs(taken)
            for job in normalized:
                self._jobs[job.id] = job
                self._submitted_at[job.id] = now
                self._rows[job.id] = JobRow(version=0)

    def version(self) -> int:
        with self._lock:
            return self._version

    def load(self) -> tuple[LoadedFleet, int]:
        with self._lock:
            return LoadedFleet(
                jobs=tuple(self._jobs.values()),
                rows=dict(self._rows),
                migrations=tuple(self._open()),
                submitted_at=dict(self._submitted_at),
                status={i: self._status.get(i, "active") for i in self._jobs},
                accrued_until_s=self._accrued_until_s,
                held_until_s=dict(self._held_until_s),
            ), self._version

    def set_control(
        self,
        job_id: JobId,
        *,
        status: str | None = None,
        held_until_s: float | Unset | None = UNSET,
    ) -> int:
        check_control(status, held_until_s)
        with self._lock:
            self._known({job_id})
            if status is not None:
                self._status[job_id] = status
            if held_until_s is None:
                self._held_until_s.pop(job_id, None)
            elif not isinstance(held_until_s, Unset):
                self._held_until_s[job_id] = float(held_until_s)
            self._version += 1
            return self._version

    def _known(self, ids: set[JobId]) -> None:
        unknown = sorted(ids - self._jobs.keys())
        if unknown:
            raise unknown_jobs(unknown)

    def _check_migrations(self, batch: Sequence[MigrationRecord]) -> None:
        """A second open migration for a job, judged on the state after `batch` (so one
        batch may close a job's migration and open its next, in either order)."""
        if not any(m.is_open for m in batch):
            return
        after = {**self._migrations, **{m.id: m for m in batch}}
        for m in batch:
            if m.is_open:
                for other in after.values():
                    if other.job_id == m.job_id and other.id != m.id and other.is_open:
                        raise open_migration_conflict(m, other)

    def commit(
        self,
        events: Sequence[Event],
        rows: Mapping[JobId, JobRow],
        *,
        expected_version: int,
        migrations: Sequence[MigrationRecord] = (),
        accrued_until_s: float | None = None,
    ) -> int:
        check_migrations(migrations)
        with self._lock:
            if self._version != expected_version:
                raise VersionConflict(
                    f"fleet version is {self._version}, not "
                    f"{expected_version}: another writer committed; "
                    "reload and retry",
                    expected=expected_version,
                    actual=self._version,
                )
            self._known({e.job_id for e in events} | set(rows) | {m.job_id for m in migrations})
            self._check_migrations(migrations)
            self._apply(events, rows)
            for m in migrations:
                self._migrations[m.id] = m
            if accrued_until_s is not None:
                self._accrued_until_s = float(accrued_until_s)
            self._version += 1
            return self._version

    def _apply(self, events: Sequence[Event], rows: Mapping[JobId, JobRow]) -> None:
        for job_id, row in rows.items():
            self._rows[job_id] = normalize_row(row, self._rows[job_id].version + 1)
        self._events.extend(normalize_event(e) for e in events)

    @contextmanager
    def claim_jobs(self, n: int) -> Iterator[MemoryJobClaim]:
        with self._lock:
            ids = [
                i
                for i, row in self._rows.items()
                if row.phase != Phase.DONE and i not in self._claimed
            ][: max(n, 0)]
            self._claimed.update(ids)
            claim = MemoryJobClaim(self, {i: self._rows[i] for i in ids})
        try:
            yield claim
        finally:
            with self._lock:
                self._claimed.difference_update(ids)

    # -- events -------------------------------------------------------------------------
    def history(self, job_id: JobId) -> list[Event]:
        with self._lock:
            self._known({job_id})
            return [e for e in self._events if e.job_id == job_id]

    def events(
        self, *, since_id: int = 0, job_id: JobId | None = None, limit: int = 1000
    ) -> list[tuple[int, Event]]:
        with self._lock:
            out: list[tuple[int, Event]] = []
            for k in range(max(since_id, 0), len(self._events)):
                if len(out) >= limit:
                    break
                e = self._events[k]
                if job_id is None or e.job_id == job_id:
                    out.append((k + 1, e))
            return out

    # -- instances ----------------------------------------------------------------------
    def record_instance(self, instance: InstanceRecord) -> None:
        instance = replace(
            instance, launched_at=as_utc(instance.launched_at, "launched_at", instance.id)
        )
        with self._lock:
            for other in self._instances.values():
                if (other.id == instance.id) != (other.request_id == instance.request_id):
                    raise instance_clash(instance, other.id, other.request_id)
            if instance.job_id is not None:
                self._known({instance.job_id})
            self._instances[instance.id] = instance

    def instances(self, cluster: str, *, job_id: JobId | None = None) -> list[InstanceRecord]:
        with self._lock:
            found = [
                i
                for i in self._instances.values()
                if i.cluster == cluster and (job_id is None or i.job_id == job_id)
            ]
        return sorted(found, key=lambda i: (i.launched_at, i.id))

    # -- migrations ---------------------------------------------------------------------
    def save_migration(self, migration: MigrationRecord) -> None:
        check_migrations([migration])
        with self._lock:
            self._known({migration.job_id})
            self._check_migrations([migration])
            self._migrations[migration.id] = migration

    def _open(self, job_id: JobId | None = None) -> list[MigrationRecord]:
        found = [
            m
            for m in self._migrations.values()
            if m.is_open and (job_id is None or m.job_id == job_id)
        ]
        return sorted(found, key=lambda m: (m.started_s, m.id))

    def open_migrations(self, job_id: JobId | None = None) -> list[MigrationRecord]:
        with self._lock:
            return self._open(job_id)

    # -- signal samples -----------------------------------------------------------------
    def append_samples(self, rows: Any) -> None:
        new = list(iter_samples(rows))
        with self._lock:
            for s in new:
                self._samples.setdefault(s.identity(), s)

    def samples(
        self, kind: SignalKind, keys: Sequence[str] | None, start_s: float, end_s: float
    ) -> list[SignalSample]:
        kind = SignalKind(kind)
        start, end = from_s(start_s), from_s(end_s)
        wanted = None if keys is None else set(keys)
        with self._lock:
            found = [
                s
                for s in self._samples.values()
                if s.kind is kind and start <= s.time < end and (wanted is None or s.key in wanted)
            ]
        return sorted(found, key=sample_sort_key)

    def observed_samples(self, start_s: float, end_s: float) -> list[SignalSample]:
        start, end = from_s(start_s), from_s(end_s)
        with self._lock:
            found = [s for s in self._samples.values() if start <= s.observed_at < end]
        return sorted(found, key=lambda s: s.observed_at)


class MemoryJobClaim:
    """Jobs claimed by `MemoryStateStore.claim_jobs`; see `orchestrator.state.JobClaim`."""

    def __init__(self, store: MemoryStateStore, rows: Mapping[JobId, JobRow]) -> None:
        self._store = store
        self.rows: Mapping[JobId, JobRow] = rows
        self._done = False

    @property
    def job_ids(self) -> tuple[JobId, ...]:
        return tuple(self.rows)

    def commit(self, events: Sequence[Event], rows: Mapping[JobId, JobRow]) -> int:
        check_claimed(self.rows, events, rows, self._done)
        self._done = True
        store = self._store
        with store._lock:
            stale = sorted(i for i in rows if store._rows[i].version != self.rows[i].version)
            if stale:
                raise VersionConflict(
                    f"jobs changed since they were claimed: {', '.join(stale[:5])}"
                )
            store._apply(events, rows)
            store._version += 1
            store._claimed.difference_update(self.rows)
            return store._version
