"""The replay service: jobs and a trace in, every policy through the loop, outputs written.

Every replay goes through here:

- `replay(request)`: ``heliotrope replay`` and the ``heliotrope_replay`` DAG task. Reads the
  trace directory (or generates the built-in scenario), the polled samples where the trace
  directory has them, the jobs file; keeps the jobs of the request's window; runs each
  policy; writes results.json, timeline.csv, cumulative.csv, the plots and report.html.
- `replay_loaded(jobs, grid, policies, out_dir)`: the same for jobs and a grid already in
  memory (the live demo replays the period it just ran).
- `run_policies(policies, jobs, grid, options=...)` (from `runner`): the runs alone, for
  the bench suites, which account and tabulate them their own way.

A request names its fields the way its caller spells them (`FieldNames`: the CLI's flags,
the DAG's params), so a refusal names what the person typed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from orchestrator.clock import utc
from orchestrator.errors import InputError
from orchestrator.model import JobSpec
from orchestrator.replay.runner import (
    ProgressFn,
    Replay,
    replay_on_grid,
    run_policies,
    run_replay,
)
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.traces import Trace
from orchestrator.signals.view import Samples
from policies.base import Policy

logger = logging.getLogger(__name__)

#: Policies a replay runs when none are given (the CLI's and the DAG's default).
DEFAULT_POLICIES: Final = (
    "heliotrope",
    "on-demand",
    "spot-failover",
    "uniform-progress",
    "carbon-greedy",
    "curtailment-threshold",
)


@dataclass(frozen=True, slots=True)
class FieldNames:
    """How a caller spells the request's fields, for its error messages: `where` is the
    error's source ("" for command-line flags, "params" for a DAG run's params)."""

    where: str = ""
    policies: str = "--policies"
    carbon: str = "--carbon-price"
    tick: str = "--tick-minutes"
    days: str = "--days"
    window: str = "--since, --until"


CLI_FIELDS: Final = FieldNames()
DAG_FIELDS: Final = FieldNames(
    where="params",
    policies="policies",
    carbon="carbon_price",
    tick="tick_minutes",
    days="window_days",
    window="window_start, window_days",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayRequest:
    """One replay, as a person asked for it.

    `anchor`: when the jobs' ``start_offset_h`` counts from (default: the trace's manifest
    start). Only jobs starting in [`keep_from`, `keep_until`) are replayed (either bound may
    be open); with `window`, in [anchor, anchor + window) instead (when there is an anchor).
    Without `traces` the built-in scenario is generated: `scenario_days` long, from
    `scenario_start` (default: the scenario's own start)."""

    jobs_file: Path
    out_dir: Path
    policies: tuple[str, ...] = DEFAULT_POLICIES
    traces: Path | None = None
    scenario_days: float = 14.0
    scenario_start: datetime | None = None
    anchor: datetime | None = None
    keep_from: datetime | None = None
    keep_until: datetime | None = None
    window: timedelta | None = None
    carbon_usd_per_tonne: float = 0.0
    seed: int = 0
    tick_minutes: float = 10.0
    names: FieldNames = CLI_FIELDS

    @property
    def tick_s(self) -> int:
        return int(self.tick_minutes * 60)


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did and wrote: the runs, results.json's content, the files."""

    replay: Replay
    results: dict[str, Any]
    paths: Mapping[str, Path]  # results, timeline, report
    source: str = ""  # the traces in words, as results.json's config says

    @property
    def report(self) -> Path:
        return self.paths["report"]


def replay(request: ReplayRequest, *, progress: ProgressFn | None = None) -> ReplayResult:
    """Run `request` and write its outputs under ``request.out_dir``. Bad input raises
    `InputError` (naming the caller's field) before anything is written."""
    from orchestrator.jobs import load_jobs
    from policies.registry import make_policy

    names = _check(request)
    policies = [make_policy(n) for n in names]
    trace, source, samples = _load_trace(request)
    anchor = request.anchor or _manifest_start(trace)
    jobs = load_jobs(request.jobs_file, trace_start=anchor)
    lo, hi = request.keep_from, request.keep_until
    if request.window is not None and anchor is not None:
        lo, hi = anchor, anchor + request.window
    jobs = keep_window(jobs, lo, hi, request)
    result = run_replay(
        trace,
        jobs,
        policies,
        tick_s=request.tick_s,
        seed=request.seed,
        carbon_usd_per_tonne=request.carbon_usd_per_tonne,
        progress=progress,
        samples=samples,
    )
    extra = {"traces": source, "jobs_file": str(request.jobs_file)}
    return write(result, request.out_dir, extra_config=extra, source=source)


def replay_loaded(
    jobs: Sequence[JobSpec],
    grid: SignalGrid,
    policies: Sequence[str | Policy],
    out_dir: Path,
    *,
    carbon_usd_per_tonne: float = 0.0,
    seed: int = 0,
    config: Mapping[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> ReplayResult:
    """Replay jobs already loaded on a grid already built (the live demo's period) under
    `policies` (registry names or policies) and write the outputs under `out_dir`; `config`
    goes into results.json's config beside the tick and start."""
    from policies.registry import make_policy

    chosen = [make_policy(p) if isinstance(p, str) else p for p in policies]
    result = replay_on_grid(
        jobs, grid, chosen, carbon_usd_per_tonne=carbon_usd_per_tonne, seed=seed, progress=progress
    )
    return write(result, out_dir, extra_config=dict(config or {}))


def write(
    result: Replay,
    out_dir: Path,
    *,
    extra_config: Mapping[str, Any] | None = None,
    source: str = "",
) -> ReplayResult:
    """results.json, timeline.csv, cumulative.csv, the plots and report.html of `result`."""
    from orchestrator.replay.metrics import results, write_outputs

    doc = results(result, extra_config=dict(extra_config or {}))
    paths = write_outputs(result, out_dir, doc=doc)
    return ReplayResult(replay=result, results=doc, paths=paths, source=source)


def keep_window(
    jobs: tuple[JobSpec, ...], lo: datetime | None, hi: datetime | None, request: ReplayRequest
) -> tuple[JobSpec, ...]:
    """The jobs that start in [lo, hi) (None: open); none is refused, naming the request's
    window fields."""
    if lo is None and hi is None:
        return jobs
    kept = tuple(j for j in jobs if (lo is None or lo <= j.start) and (hi is None or j.start < hi))
    if not kept:
        start = "the first job" if lo is None else f"{lo:%Y-%m-%d %H:%M}"
        end = "the last job" if hi is None else f"{hi:%Y-%m-%d %H:%M} UTC"
        raise InputError(
            str(request.jobs_file),
            "jobs",
            f"at least one job starting in the window {start} .. {end}",
            got=f"{len(jobs)} job(s), none inside",
            fix=f"move the window ({request.names.window}) or the jobs' start_offset_h",
        )
    if len(kept) < len(jobs):
        logger.info("window: replaying %d of %d jobs", len(kept), len(jobs))
    return kept


def _check(request: ReplayRequest) -> list[str]:
    """The policy names, after the request's numbers are checked."""
    n = request.names
    names = [p.strip() for p in request.policies if p and p.strip()]
    if not names:
        raise InputError(n.where, n.policies, "at least one policy name")
    carbon = request.carbon_usd_per_tonne
    if not math.isfinite(carbon) or carbon < 0:
        raise InputError(n.where, n.carbon, "a price >= 0 USD per tonne", got=carbon)
    minutes = request.tick_minutes
    if not math.isfinite(minutes) or minutes <= 0 or minutes * 60 != int(minutes * 60):
        raise InputError(n.where, n.tick, "a positive whole number of seconds", got=minutes)
    days = request.scenario_days
    if request.traces is None and not (math.isfinite(days) and days > 0):
        raise InputError(n.where, n.days, "a positive number of days", got=days)
    return names


def _load_trace(request: ReplayRequest) -> tuple[Trace, str, Samples | None]:
    """The trace, the words for it, and the polled samples when the trace directory has
    them (what `signals poll` / the signals DAG recorded: replayed by the live view's rule,
    as the live controller knew them)."""
    if request.traces is None:
        from orchestrator.signals.scenario import generate

        seed, days = request.seed, request.scenario_days
        start = request.scenario_start
        trace = generate(seed, days) if start is None else generate(seed, days, start=start)
        return trace, f"built-in scenario (seed {seed}, {days:g} days)", None
    from orchestrator.signals.poll import SAMPLES_FILE, read_samples
    from orchestrator.signals.traces import read_trace

    trace = read_trace(request.traces)
    source = str(request.traces)
    if not (request.traces / SAMPLES_FILE).is_file():
        return trace, source, None
    samples = read_samples(request.traces)  # the frame: grouped at once, not row by row
    return trace, source + " (polled samples, as the live controller knew them)", samples


def _manifest_start(trace: Trace) -> datetime | None:
    manifest = trace.manifest
    start = manifest.get("start") if hasattr(manifest, "get") else None
    if not start:
        return None
    return parse_time(str(start), "the trace's manifest start")


def parse_time(text: str, what: str, *, where: str = "params") -> datetime:
    """An ISO 8601 time (``Z`` allowed; naive means UTC), in UTC."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(
            where, what, "an ISO 8601 time, e.g. 2024-04-01T00:00:00Z", got=text
        ) from exc
    return utc(when)


__all__ = [
    "CLI_FIELDS",
    "DAG_FIELDS",
    "DEFAULT_POLICIES",
    "FieldNames",
    "ReplayRequest",
    "ReplayResult",
    "keep_window",
    "parse_time",
    "replay",
    "replay_loaded",
    "run_policies",
    "write",
]
