"""Checks and errors both stores share, so the memory store fails exactly like the SQL one."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from orchestrator.errors import InputError, PermanentError
from orchestrator.model import Event, EventKind, JobId, JobSpec, Phase
from orchestrator.state.records import (
    JOB_ROW_FLOATS,
    JOB_ROW_IDS,
    JOB_ROW_INTS,
    InstanceRecord,
    JobRow,
    MigrationRecord,
    VersionConflict,
    as_utc,
)


def from_s(s: float) -> datetime:
    return datetime.fromtimestamp(s, UTC)


def check_unique(ids: Sequence[JobId]) -> None:
    seen: set[JobId] = set()
    dupes: set[JobId] = set()
    for i in ids:
        (dupes if i in seen else seen).add(i)
    if dupes:
        raise InputError(
            "jobs",
            "id",
            "unique job ids",
            got=", ".join(sorted(dupes)),
            fix="give every job its own name",
        )


JOB_STATUSES = ("active", "cancelled")


class Unset:
    """`set_control`'s "leave the hold as it is" (None clears it)."""


UNSET = Unset()


def check_control(status: str | None, held_until_s: float | Unset | None) -> None:
    if status is not None and status not in JOB_STATUSES:
        raise InputError("state store", "status", " or ".join(JOB_STATUSES), got=repr(status))
    if isinstance(held_until_s, float | int) and math.isnan(held_until_s):
        raise InputError(
            "state store",
            "held_until_s",
            "a time in seconds (inf: until released) or None",
            got="NaN",
        )


def duplicate_jobs(ids: Sequence[JobId]) -> InputError:
    return InputError(
        "jobs",
        "id",
        "job ids not submitted before",
        got=", ".join(ids),
        fix="rename the jobs, or see `heliotrope jobs list`",
    )


def unknown_jobs(ids: Sequence[JobId]) -> InputError:
    return InputError(
        "state store",
        "job_id",
        "a submitted job",
        got=", ".join(ids[:10]),
        fix="submit the job first, or see `heliotrope jobs list`",
    )


def open_migration_conflict(m: MigrationRecord, other: MigrationRecord) -> VersionConflict:
    return VersionConflict(
        f"job {m.job_id} already has open migration {other.id} ({other.phase}); cannot open {m.id}"
    )


def instance_clash(i: InstanceRecord, other_id: str, other_request: str) -> PermanentError:
    return PermanentError(
        f"instance {i.id} with request {i.request_id} clashes with "
        f"instance {other_id} recorded for request {other_request}: "
        "a request id names exactly one instance"
    )


def check_migrations(migrations: Sequence[MigrationRecord]) -> None:
    open_jobs = [m.job_id for m in migrations if m.is_open]
    if len(open_jobs) != len(set(open_jobs)):
        raise InputError(
            "migrations",
            "job_id",
            "at most one open migration per job",
            got=", ".join(sorted(open_jobs)),
        )


def check_claimed(
    claimed: Mapping[JobId, JobRow],
    events: Sequence[Event],
    rows: Mapping[JobId, JobRow],
    done: bool,
) -> None:
    if done:
        raise PermanentError("this claim was already committed; claim again")
    outside = sorted(({e.job_id for e in events} | set(rows)) - set(claimed))
    if outside:
        raise InputError(
            "claim",
            "job_id",
            "only jobs this claim holds",
            got=", ".join(outside[:10]),
            fix="claim them first",
        )


def normalize_job(job: JobSpec) -> JobSpec:
    """The job as a store gives it back: UTC times, floats, a plain dict of throughputs."""
    return replace(
        job,
        work_gpu_hours=float(job.work_gpu_hours),
        gpus=int(job.gpus),
        start=as_utc(job.start, "start", job.id),
        deadline=as_utc(job.deadline, "deadline", job.id),
        checkpoint_size_gb=float(job.checkpoint_size_gb),
        cold_start_h=float(job.cold_start_h),
        gpu_types=frozenset(job.gpu_types),
        throughput={k: float(v) for k, v in job.throughput.items()},
        budget_usd=None if job.budget_usd is None else float(job.budget_usd),
        checkpoint_interval_h=float(job.checkpoint_interval_h),
    )


def normalize_row(row: JobRow, version: int) -> JobRow:
    """The row as a store gives it back: NaN as None, '' ids as None, plain numbers."""
    values: dict[str, Any] = {"phase": Phase(int(row.phase)), "version": version}
    for name in JOB_ROW_FLOATS:
        v = getattr(row, name)
        values[name] = None if v is None or math.isnan(v) else float(v)
    for name in JOB_ROW_INTS:
        values[name] = int(getattr(row, name))
    for name in JOB_ROW_IDS:
        values[name] = getattr(row, name) or None
    return JobRow(**values)


def normalize_event(event: Event) -> Event:
    return replace(
        event,
        time_s=float(event.time_s),
        kind=EventKind(event.kind),
        data={k: float(v) for k, v in event.data.items()},
    )
