"""The jobs file: what a person asks Heliotrope to run (YAML; see docs/jobs.md).

Validated with pydantic at this edge and turned into frozen `JobSpec`s. Every error names
the file, the job and field (``jobs[2].deadline``), what was expected and how to fix it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator import catalog
from orchestrator.clock import utc
from orchestrator.errors import HeliotropeError, InputError
from orchestrator.model import JobSpec
from orchestrator.yamlio import load_yaml

MAX_HOURS = 10 * 366 * 24.0  # ten years: any later time is a typo (and overflows datetime)


class JobEntry(BaseModel):
    """One entry of the `jobs:` list. Times are ISO 8601 (UTC unless an offset is given)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    work_gpu_hours: float = Field(
        gt=0, le=1e8, allow_inf_nan=False, description="reference GPU-hours (one A100-80GB)"
    )
    gpus: int = Field(default=1, ge=1, le=4096)
    gpu_types: list[str] = Field(default_factory=list)
    throughput: dict[str, Annotated[float, Field(gt=0, le=1e4, allow_inf_nan=False)]] = Field(
        default_factory=dict
    )
    start: datetime | None = None
    start_offset_h: float | None = Field(default=None, ge=0, le=MAX_HOURS, allow_inf_nan=False)
    deadline: datetime | None = None
    deadline_h: float | None = Field(default=None, gt=0, le=MAX_HOURS, allow_inf_nan=False)
    checkpoint_size_gb: float = Field(default=10.0, ge=0, le=1e6, allow_inf_nan=False)
    cold_start_h: float = Field(default=0.1, ge=0, le=MAX_HOURS, allow_inf_nan=False)
    checkpoint_interval_h: float = Field(default=1.0, ge=0, le=MAX_HOURS, allow_inf_nan=False)
    home_region: str = Field(min_length=1)
    budget_usd: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    count: int = Field(default=1, ge=1, le=10_000)
    command: list[str] = Field(default_factory=list)
    carbon_usd_per_tonne: float | None = Field(default=None, ge=0, le=1e5, allow_inf_nan=False)
    launcher: Literal["torchrun", "none"] = "torchrun"

    @model_validator(mode="after")
    def _one_of_each(self) -> JobEntry:
        if (self.start is None) == (self.start_offset_h is None):
            raise ValueError(
                "give exactly one of `start` (a time) or `start_offset_h` "
                "(hours after the trace starts)"
            )
        if (self.deadline is None) == (self.deadline_h is None):
            raise ValueError(
                "give exactly one of `deadline` (a time) or `deadline_h` "
                "(hours after the job starts)"
            )
        return self


class JobsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: dict[str, Any] = Field(default_factory=dict)
    jobs: list[dict[str, Any]] = Field(min_length=1)


def load_jobs(path: Path, *, trace_start: datetime | None = None) -> tuple[JobSpec, ...]:
    """Read and validate a jobs file. `trace_start` anchors `start_offset_h`."""
    where = str(path)
    raw = load_yaml(path, what="a jobs file", fix="see docs/jobs.md and docs/examples/jobs.yaml")
    return parse_jobs(raw, where=where, trace_start=trace_start)


def parse_jobs(
    raw: object, *, where: str = "<jobs>", trace_start: datetime | None = None
) -> tuple[JobSpec, ...]:
    try:
        doc = JobsFile.model_validate(raw)
    except ValidationError as exc:
        raise _input_error(where, exc, prefix="") from exc
    specs: list[JobSpec] = []
    names: set[str] = set()
    for i, item in enumerate(doc.jobs):
        field_prefix = f"jobs[{i}]"
        try:
            entry = JobEntry.model_validate({**doc.defaults, **item})
        except ValidationError as exc:
            raise _input_error(where, exc, prefix=field_prefix) from exc
        for gpu_type in [*entry.gpu_types, *entry.throughput]:
            try:
                catalog.gpu(gpu_type)
            except HeliotropeError:
                raise InputError(
                    where,
                    f"{field_prefix}.gpu_types",
                    "known GPU types: " + ", ".join(sorted(catalog.GPUS)),
                    got=repr(gpu_type),
                    fix="use a catalog GPU name",
                ) from None
        if entry.start is not None:
            start = utc(entry.start)
        elif trace_start is not None:
            start = utc(trace_start) + timedelta(hours=entry.start_offset_h or 0.0)
        else:
            raise InputError(
                where,
                f"{field_prefix}.start_offset_h",
                "an absolute `start` when no trace start is known",
                fix="give `start:` as a time",
            )
        deadline = (
            utc(entry.deadline)
            if entry.deadline is not None
            else start + timedelta(hours=entry.deadline_h or 0.0)
        )
        if deadline <= start:
            raise InputError(
                where,
                f"{field_prefix}.deadline",
                "a time after the job's start",
                got=f"{deadline.isoformat()} (start {start.isoformat()})",
                fix="move the deadline later or the start earlier",
            )
        for n in range(entry.count):
            name = entry.name if entry.count == 1 else f"{entry.name}-{n:03d}"
            if name in names:
                raise InputError(
                    where,
                    f"{field_prefix}.name",
                    "unique job names",
                    got=repr(name),
                    fix="rename one of the jobs",
                )
            names.add(name)
            specs.append(
                JobSpec(
                    id=name,
                    work_gpu_hours=entry.work_gpu_hours,
                    gpus=entry.gpus,
                    start=start,
                    deadline=deadline,
                    checkpoint_size_gb=entry.checkpoint_size_gb,
                    cold_start_h=entry.cold_start_h,
                    home_region=entry.home_region,
                    gpu_types=frozenset(catalog.gpu(g).name for g in entry.gpu_types),
                    throughput={catalog.gpu(g).name: v for g, v in entry.throughput.items()},
                    budget_usd=entry.budget_usd,
                    checkpoint_interval_h=entry.checkpoint_interval_h,
                    command=tuple(entry.command),
                    carbon_usd_per_tonne=entry.carbon_usd_per_tonne,
                    launcher=entry.launcher,
                )
            )
    return tuple(specs)


def _input_error(where: str, exc: ValidationError, *, prefix: str) -> InputError:
    err = exc.errors()[0]
    loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in err["loc"])
    loc = loc.replace(".[", "[")
    field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc or "document")
    msg = err["msg"].removeprefix("Value error, ")
    fix = {
        "extra_forbidden": "remove it or check its spelling (see docs/jobs.md)",
        "missing": "add it",
    }.get(err["type"], "see docs/jobs.md")
    got = err.get("input") if err["type"] != "missing" else None
    if isinstance(got, dict):
        got = None
    return InputError(where, field, msg, got=repr(got) if got is not None else None, fix=fix)
