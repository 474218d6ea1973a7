"""Benchmark suites as code: named settings that `heliotrope bench policies --suite NAME` runs.

A suite builds its trace in memory from ``../shared/data`` (never copied into the
repository), one or more *settings* (a sweep point) and, per setting, *windows* (one replay
each, usually one job). Every policy, the oracle included, is accounted by the same loop
(`orchestrator.replay.runner.run_policy`) on the same realized grid; the oracle is always
run, because regret ``J(policy) / J(oracle) - 1`` is measured against it.

Suites:

- ``skynomad-h100``: the setting behind SkyNomad's published H100 means (arXiv 2601.06520,
  artifact ``andylizf/skynomad-artifact``; see ``shared/data/SOURCES.md``). GCP a3-highgpu-8g
  in 6 zones, spot availability every 600 s from 2025-10-04T00:10Z, constant per-zone list
  prices; one job per window: work ``deadline / deadline_ratio`` instance-hours (34.556 h),
  deadline 311 ticks (51.833 h), cold start 0.2 h, checkpoint 50 GB, 0.02 USD/GB for every
  cross-region move, no transfer time, continuous checkpoints (a preemption loses no work);
  windows start at ticks 0, 311, 622, 933, 1244, 1556. Every tick billed by default (the
  artifact's numbers with every tick billed: Optimal 574.11, exact oracle 573.04 USD).
  `deadline_ratio`, `checkpoint_gb`, `cold_start_hours` and `work_hours` may be lists: one
  setting per point of their cross product (the paper's deadline and checkpoint sweeps,
  whose published means are attached as anchors); `egress_usd_per_gb` and `transfer_gbps`
  (copies take time at that bandwidth) change the move costs.
- ``cbl-v100``: the 9 AWS p3.2xlarge (V100) zones of the Can't Be Late 2023-02-15 traces
  (Wu et al., NSDI'24), 195 s ticks, per-tick spot prices from the SkyNomad artifact,
  on-demand 3.06 USD/h. Jobs of 48 instance-hours (the Can't Be Late paper's job length)
  with 4 h and 22 h of slack, cold starts of 0.05 h and 0.2 h (4 settings), 6 windows a
  week apart; other costs as in ``skynomad-h100``. The trace's absolute start is taken as
  2023-02-15T00:00Z (the files carry only the date). `work_hours`, `slack_hours` (or
  `deadline_ratio` instead), `cold_start_hours` and `checkpoint_gb` may be lists.

Every table also reports, per policy, the mean J / J(oracle) over the *non-trivial* windows
(where the oracle's schedule is not one uninterrupted stay per job from its first tick: on
the others every sensible policy is at the optimum and dilutes the mean) and the worst
window's ratio. `suite_timelines` (CLI `--timeline JOB[@WINDOW]`) prints one job's
placement tick by tick under each policy beside the oracle's.

Billing (options of both suites): by default every tick is billed, the finishing tick whole
(``CostSettings.bill_final_tick``). ``drop_finishing_tick`` reports SkyNomad's published
convention: the loop still bills every tick, the report leaves out the tick in which each job
finishes (for every policy), and the oracle minimizes that reported cost (paper: Optimal
571.38). ``bill_to_finish`` bills the finishing tick up to the finishing instant instead
(Heliotrope's own convention); that is neither published number.

A replay grid runs past the deadline (one more deadline's length where the data reaches), so
a policy that misses its deadline is billed until it finishes; misses are counted apart.
Carbon uses Electricity Maps yearly averages of each region's grid zone (location-based).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import numpy as np
import pandas as pd

from orchestrator import catalog
from orchestrator.errors import InputError, UnknownNameError
from orchestrator.loop import LoopOptions
from orchestrator.model import CostSettings, EventKind, FleetState, JobSpec, Market, Phase
from orchestrator.replay.runner import PolicyRun, run_policy
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.traces import Trace, empty_frame, make_manifest
from policies.base import Policy
from policies.costs import JobOfferFit
from policies.oracle import Hindsight, Oracle
from policies.registry import make_policy
from providers.sim import realize_spot

SuiteProgress = Callable[[str, int, int], None]  # what is running, runs done, runs total

ORACLE: Final = "oracle"

# --- suite data ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SuiteCase:
    """One replay: the jobs of one window of one setting, on `trace` from `start` to `end`."""

    setting: str
    window: str
    trace: Trace
    jobs: tuple[JobSpec, ...]
    tick_s: int
    start: datetime
    end: datetime
    settings: CostSettings
    drop_finishing_tick: bool = False  # report SkyNomad's convention (module docstring)


@dataclass(frozen=True, slots=True)
class Suite:
    """A named benchmark: its cases, the options it was built with and published numbers
    to compare with (`anchors[setting][label]`, USD per job)."""

    name: str
    description: str
    cases: tuple[SuiteCase, ...]
    config: Mapping[str, Any]
    anchors: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    oracle_levels: int = 16384  # the oracle's progress grid bound (`Oracle.max_progress_levels`)


SuiteFactory = Callable[[Path, Mapping[str, Any]], Suite]


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowResult:
    """One policy on one window: totals over the window's jobs. With the finishing tick
    dropped, `usd` and `kg_co2` leave out `finishing_tick_usd` (and its carbon)."""

    setting: str
    window: str
    policy: str
    jobs: int
    usd: float
    kg_co2: float
    finishing_tick_usd: float
    objective_usd: float
    deadlines_met: int
    finished: int
    preemptions: int
    migrations: int
    launches: int
    regret: float | None  # J / J(oracle) - 1 on this window
    # The oracle's schedule here is one uninterrupted stay per job from its first tick (one
    # launch, at once, never preempted): every sensible policy finds it, the window says
    # little.
    trivial: bool = False


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy over a setting (or over the whole suite: setting ``"all"``)."""

    setting: str
    policy: str
    jobs: int
    mean_usd_per_job: float
    mean_kg_co2_per_job: float
    mean_objective_usd_per_job: float
    deadlines_met: int
    regret: float | None  # sum J / sum J(oracle) - 1
    windows: int = 0
    nontrivial_windows: int = 0  # windows where the oracle's plan is not one stay per job
    nontrivial_mean_ratio: float | None = None  # mean J / J(oracle) over those windows
    worst_ratio: float | None = None  # the largest J / J(oracle) of any window
    worst_window: str = ""


@dataclass(frozen=True, slots=True)
class SuiteResult:
    suite: str
    description: str
    config: Mapping[str, Any]
    policies: tuple[str, ...]
    summary: tuple[PolicySummary, ...]  # per policy over every case
    by_setting: tuple[PolicySummary, ...]  # per (setting, policy)
    windows: tuple[WindowResult, ...]
    anchors: Mapping[str, Mapping[str, float]]
    elapsed_s: float

    def policy(self, name: str, setting: str | None = None) -> PolicySummary:
        rows = self.summary if setting is None else self.by_setting
        for row in rows:
            if row.policy == name and (setting is None or row.setting == setting):
                return row
        raise KeyError((name, setting))

    def settings(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(w.setting for w in self.windows))

    def to_json(self) -> dict[str, Any]:
        def summary(rows: Iterable[PolicySummary]) -> list[dict[str, Any]]:
            return [
                {
                    "setting": r.setting,
                    "policy": r.policy,
                    "jobs": r.jobs,
                    "mean_usd_per_job": _r(r.mean_usd_per_job, 4),
                    "mean_kg_co2_per_job": _r(r.mean_kg_co2_per_job, 4),
                    "mean_objective_usd_per_job": _r(r.mean_objective_usd_per_job, 4),
                    "deadlines_met": r.deadlines_met,
                    "deadlines_total": r.jobs,
                    "regret": _r(r.regret, 6),
                    "windows": r.windows,
                    "nontrivial_windows": r.nontrivial_windows,
                    "nontrivial_mean_ratio": _r(r.nontrivial_mean_ratio, 6),
                    "worst_ratio": _r(r.worst_ratio, 6),
                    "worst_window": r.worst_window,
                }
                for r in rows
            ]

        return {
            "suite": self.suite,
            "description": self.description,
            "config": _jsonable(self.config),
            "policies": list(self.policies),
            "summary": summary(self.summary),
            "by_setting": summary(self.by_setting),
            "windows": [
                {
                    "setting": w.setting,
                    "window": w.window,
                    "policy": w.policy,
                    "jobs": w.jobs,
                    "usd": _r(w.usd, 4),
                    "kg_co2": _r(w.kg_co2, 4),
                    "finishing_tick_usd_dropped": _r(w.finishing_tick_usd, 4),
                    "objective_usd": _r(w.objective_usd, 4),
                    "deadlines_met": w.deadlines_met,
                    "finished": w.finished,
                    "preemptions": w.preemptions,
                    "migrations": w.migrations,
                    "launches": w.launches,
                    "regret": _r(w.regret, 6),
                    "trivial": w.trivial,
                }
                for w in self.windows
            ],
            "anchors": {s: dict(a) for s, a in self.anchors.items()},
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def format_table(self) -> str:
        """Plain-text tables: per setting and policy, then per window. A regret marked `*`
        belongs to a policy (the oracle included) that missed deadlines: not comparable.
        `non-triv` is the mean J / J(oracle) over the windows where the oracle's plan is not
        one uninterrupted stay per job (how many: `n`), `worst` the largest window's."""
        lines = [f"suite {self.suite}: {self.description}"]
        head = (
            f"{'setting':28s} {'policy':22s} {'USD/job':>10s} {'kgCO2/job':>10s} "
            f"{'met':>7s} {'regret':>8s} {'non-triv':>9s} {'n':>3s} {'worst':>7s} "
            f"{'(window)':10s}"
        )

        def row(setting: str, r: PolicySummary) -> str:
            missed = r.deadlines_met < r.jobs
            return (
                f"{setting:28s} {r.policy:22s} {r.mean_usd_per_job:10.2f} "
                f"{r.mean_kg_co2_per_job:10.2f} {f'{r.deadlines_met}/{r.jobs}':>7s} "
                f"{_pct(r.regret, missed):>8s} {_x(r.nontrivial_mean_ratio):>9s} "
                f"{r.nontrivial_windows:3d} {_x(r.worst_ratio):>7s} {r.worst_window:10s}"
            ).rstrip()

        lines += ["", head, "-" * len(head)]
        for r in self.by_setting:
            lines.append(row(r.setting, r))
            for label, value in self.anchors.get(r.setting, {}).items():
                if r.policy == ORACLE and label.startswith("SkyNomad Optimal"):
                    lines.append(f"{'':28s} {'  anchor: ' + label:22s} {value:10.2f}")
        if len(self.settings()) > 1:
            lines += ["", head, "-" * len(head)]
            lines += [row("all", r) for r in self.summary]
        head = (
            f"{'setting':28s} {'window':10s} {'policy':22s} {'USD':>10s} {'kgCO2':>9s} "
            f"{'met':>5s} {'regret':>8s}"
        )
        lines += ["", head, "-" * len(head)]
        for w in self.windows:
            lines.append(
                f"{w.setting:28s} {w.window:10s} {w.policy:22s} {w.usd:10.2f} "
                f"{w.kg_co2:9.2f} {f'{w.deadlines_met}/{w.jobs}':>5s} "
                f"{_pct(w.regret, w.deadlines_met < w.jobs):>8s}"
                + ("  (trivial)" if w.trivial and w.policy == ORACLE else "")
            )
        if any(w.deadlines_met < w.jobs for w in self.windows):
            lines += ["", "* missed deadlines: regret not comparable"]
        extra = [(s, label, v) for s, a in self.anchors.items() for label, v in a.items()]
        if extra:
            lines += ["", "published numbers (USD per job):"]
            lines += [f"  {s:26s} {label:40s} {v:10.2f}" for s, label, v in extra]
        return "\n".join(lines)


def _r(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _x(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}x"


def _pct(value: float | None, missed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{100 * value:+.2f}%" + ("*" if missed else "")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return str(value)


# --- running ------------------------------------------------------------------------------


def run_suite(
    name: str,
    data_dir: Path,
    policies: Sequence[str],
    overrides: Mapping[str, Any] | None = None,
    progress: SuiteProgress | None = None,
    workers: int = 1,
) -> SuiteResult:
    """Run `policies` (registry names) and the oracle over suite `name`'s cases, the cases
    spread over `workers` processes (each builds the suite once; results are the same)."""
    factory = SUITES.get(name)
    if factory is None:
        raise UnknownNameError("suite", name, list(SUITES))
    if workers < 1:
        raise InputError("", "workers", "a whole number >= 1", got=workers)
    names = tuple(dict.fromkeys([ORACLE, *(p.strip() for p in policies if p.strip())]))
    for n in names:
        if n != ORACLE:
            make_policy(n)  # fail on an unknown name before any work
    t_start = time.perf_counter()
    options = dict(overrides or {})
    suite = factory(Path(data_dir), options)
    total = len(suite.cases) * len(names)
    windows: list[WindowResult] = []
    if workers == 1 or len(suite.cases) == 1:
        for i, case in enumerate(suite.cases):

            def step(label: str, k: int, base: int = i * len(names)) -> None:
                if progress is not None:
                    progress(label, base + k, total)

            windows += run_case(case, names, suite.oracle_levels, step)
    else:
        windows = _run_cases_in_pool(
            name, Path(data_dir), options, suite, names, workers, progress, total
        )
    if progress is not None:
        progress("done", total, total)
    settings = tuple(dict.fromkeys(c.setting for c in suite.cases))
    by_setting = tuple(
        _summarize(
            s,
            n,
            [w for w in windows if w.setting == s and w.policy == n],
            [w for w in windows if w.setting == s and w.policy == ORACLE],
        )
        for s in settings
        for n in names
    )
    summary = tuple(
        _summarize(
            "all",
            n,
            [w for w in windows if w.policy == n],
            [w for w in windows if w.policy == ORACLE],
        )
        for n in names
    )
    return SuiteResult(
        suite=suite.name,
        description=suite.description,
        config=suite.config,
        policies=names,
        summary=summary,
        by_setting=by_setting,
        windows=tuple(windows),
        anchors=suite.anchors,
        elapsed_s=time.perf_counter() - t_start,
    )


def run_case(
    case: SuiteCase,
    names: Sequence[str],
    oracle_levels: int = 16384,
    step: Callable[[str, int], None] | None = None,
) -> list[WindowResult]:
    """Every policy of `names` (the oracle among them) on one case, regret against the
    oracle's J on the case."""
    grid = case_grid(case)
    options = LoopOptions(cluster="bench", settings=case.settings)
    deadlines = np.array([j.deadline.timestamp() for j in case.jobs])
    rows: dict[str, WindowResult] = {}
    trivial = False
    for k, n in enumerate(names):
        if step is not None:
            step(f"{case.setting} {case.window} {n}", k)
        run = run_policy(
            _case_policy(n, case, grid, oracle_levels), case.jobs, grid, options=options
        )
        f = run.fleet
        finished = f.phase == Phase.DONE
        met = finished & (f.finished_at_s <= deadlines + 1e-6)
        usd, kg = float(f.usd.sum()), float(f.kg_co2.sum())
        last_usd = last_kg = 0.0
        if case.drop_finishing_tick:
            last_usd, last_kg = finishing_tick(run, case.jobs, grid)
        usd, kg = usd - last_usd, kg - last_kg
        rows[n] = WindowResult(
            setting=case.setting,
            window=case.window,
            policy=n,
            jobs=len(case.jobs),
            usd=usd,
            kg_co2=kg,
            finishing_tick_usd=last_usd,
            objective_usd=usd + case.settings.carbon_usd_per_tonne * kg / 1000.0,
            deadlines_met=int(met.sum()),
            finished=int(finished.sum()),
            preemptions=int(f.preemptions.sum()),
            migrations=int(f.migrations.sum()),
            launches=int(f.launches.sum()),
            regret=None,
        )
        if n == ORACLE:
            trivial = _single_stays(run, case.jobs, grid)
    oracle = rows.get(ORACLE)
    base = oracle.objective_usd if oracle is not None else math.nan
    return [
        dataclasses.replace(
            r, regret=r.objective_usd / base - 1.0 if base > 0 else None, trivial=trivial
        )
        for r in (rows[n] for n in names)
    ]


def _single_stays(run: PolicyRun, jobs: Sequence[JobSpec], grid: SignalGrid) -> bool:
    """Whether every job ran as one uninterrupted stay from its first tick: launched once,
    at once, never preempted."""
    launches: dict[str, list[float]] = {}
    for e in run.events:
        if e.kind is EventKind.PREEMPTED:
            return False
        if e.kind is EventKind.LAUNCHED:
            launches.setdefault(e.job_id, []).append(e.time_s)
    return all(
        len(launches.get(j.id, [])) == 1
        and launches[j.id][0] <= max(j.start.timestamp(), grid.start_s) + grid.tick_s + 1e-6
        for j in jobs
    )


def _case_policy(name: str, case: SuiteCase, grid: SignalGrid, oracle_levels: int) -> Policy:
    if name == ORACLE:
        return Oracle(
            hindsight=Hindsight.of(grid),
            drop_finishing_tick=case.drop_finishing_tick,
            max_progress_levels=oracle_levels,
        )
    return make_policy(name)


# --- timelines ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Timeline:
    """Where one job of one case was, tick by tick, under each policy (the oracle first).
    `cells[k][p]`: `-` before its start, `idle`, `ZONE[ TYPE] spot|od` (`*`: cold start,
    `!`: preempted in that tick), `done`."""

    setting: str
    window: str
    job: str
    start: datetime
    tick_s: int
    deadline_tick: int
    policies: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    usd: tuple[float, ...]  # per policy, this job's dollars
    met: tuple[bool, ...]  # per policy, whether this job met its deadline

    def format(self) -> str:
        """One row per run of ticks in which no policy's placement changes."""
        width = max(
            [14, *(len(c) for row in self.cells for c in row), *(len(p) for p in self.policies)]
        )
        lines = [
            f"timeline of job {self.job}, window {self.window}, {self.setting}: "
            f"{self.tick_s} s ticks from {self.start:%Y-%m-%d %H:%M} UTC, deadline at "
            f"tick {self.deadline_tick} (* cold start, ! preempted)",
            f"{'ticks':>11s}  " + " ".join(f"{p:{width}s}" for p in self.policies),
        ]
        k = 0
        while k < len(self.cells):
            end = k
            while end + 1 < len(self.cells) and self.cells[end + 1] == self.cells[k]:
                end += 1
            ticks = f"{k}" if end == k else f"{k}-{end}"
            lines.append(f"{ticks:>11s}  " + " ".join(f"{c:{width}s}" for c in self.cells[k]))
            k = end + 1
        lines.append(f"{'USD':>11s}  " + " ".join(f"{u:<{width}.2f}" for u in self.usd))
        lines.append(
            f"{'deadline':>11s}  "
            + " ".join(f"{'met' if m else 'MISSED':{width}s}" for m in self.met)
        )
        return "\n".join(lines)


def suite_timelines(
    name: str,
    data_dir: Path,
    policies: Sequence[str],
    overrides: Mapping[str, Any] | None,
    job: str,
    window: str | None = None,
) -> list[Timeline]:
    """The per-tick placement of job `job` under `policies` and the oracle, in every case of
    suite `name` that has that job (only window `window`'s where given)."""
    factory = SUITES.get(name)
    if factory is None:
        raise UnknownNameError("suite", name, list(SUITES))
    names = tuple(dict.fromkeys([ORACLE, *(p.strip() for p in policies if p.strip())]))
    for n in names:
        if n != ORACLE:
            make_policy(n)
    suite = factory(Path(data_dir), dict(overrides or {}))
    cases = [
        c
        for c in suite.cases
        if (window is None or c.window == window) and any(j.id == job for j in c.jobs)
    ]
    if not cases:
        known = sorted({f"{j.id}@{c.window}" for c in suite.cases for j in c.jobs})
        raise InputError(
            "",
            "--timeline",
            "JOB[@WINDOW] of a job of the suite",
            got=f"{job}@{window}" if window else job,
            fix="one of: "
            + ", ".join(known[:12])
            + (f" ... ({len(known)} in all)" if len(known) > 12 else ""),
        )
    return [_timeline(case, names, job, suite.oracle_levels) for case in cases]


def _timeline(case: SuiteCase, names: Sequence[str], job: str, oracle_levels: int) -> Timeline:
    grid = case_grid(case)
    options = LoopOptions(cluster="bench", settings=case.settings)
    j = next(i for i, spec in enumerate(case.jobs) if spec.id == job)
    spec = case.jobs[j]
    several_types = len({o.instance_type for o in grid.offers}) > 1
    labels = [
        (o.zone or o.region)
        + (f" {o.instance_type}" if several_types else "")
        + (" spot" if o.market is Market.SPOT else " od")
        for o in grid.offers
    ]
    columns: list[list[str]] = []
    usd: list[float] = []
    met: list[bool] = []
    for n in names:
        column: list[str] = []
        seen = [0]

        def observe(
            k: int, fleet: FleetState, column: list[str] = column, seen: list[int] = seen
        ) -> None:
            phase = Phase(int(fleet.phase[j]))
            preempted = int(fleet.preemptions[j]) > seen[0]
            seen[0] = int(fleet.preemptions[j])
            if phase is Phase.PENDING:
                cell = "-"
            elif phase is Phase.DONE:
                cell = "done"
            elif phase is Phase.WAITING:
                cell = "idle"
            else:
                cell = labels[int(fleet.offer[j])] + ("*" if phase is Phase.STARTING else "")
            column.append(cell + (" !" if preempted else ""))

        run = run_policy(
            _case_policy(n, case, grid, oracle_levels),
            case.jobs,
            grid,
            options=options,
            observe=observe,
        )
        columns.append(column)
        usd.append(float(run.fleet.usd[j]))
        met.append(
            bool(
                run.fleet.phase[j] == Phase.DONE
                and run.fleet.finished_at_s[j] <= spec.deadline.timestamp() + 1e-6
            )
        )
    n_ticks = max(len(c) for c in columns)
    cells = tuple(tuple(c[k] if k < len(c) else "done" for c in columns) for k in range(n_ticks))
    return Timeline(
        setting=case.setting,
        window=case.window,
        job=job,
        start=grid.start,
        tick_s=grid.tick_s,
        deadline_tick=math.ceil((spec.deadline.timestamp() - grid.start_s) / grid.tick_s),
        policies=tuple(names),
        cells=cells,
        usd=tuple(usd),
        met=tuple(met),
    )


_WORKER_SUITE: dict[str, Suite] = {}


def _worker_case(
    name: str, data_dir: Path, overrides: dict[str, Any], index: int, names: tuple[str, ...]
) -> list[WindowResult]:
    """One case in a worker process: the suite is built once per process."""
    key = repr((name, str(data_dir), sorted(overrides.items())))
    suite = _WORKER_SUITE.get(key)
    if suite is None:
        suite = _WORKER_SUITE[key] = SUITES[name](data_dir, overrides)
    return run_case(suite.cases[index], names, suite.oracle_levels)


def _run_cases_in_pool(
    name: str,
    data_dir: Path,
    overrides: dict[str, Any],
    suite: Suite,
    names: tuple[str, ...],
    workers: int,
    progress: SuiteProgress | None,
    total: int,
) -> list[WindowResult]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    out: dict[int, list[WindowResult]] = {}
    context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
    with ProcessPoolExecutor(
        max_workers=min(workers, len(suite.cases)), mp_context=context
    ) as pool:
        futures = {
            pool.submit(_worker_case, name, data_dir, overrides, i, names): i
            for i in range(len(suite.cases))
        }
        for future in as_completed(futures):
            i = futures[future]
            out[i] = future.result()
            if progress is not None:
                case = suite.cases[i]
                progress(f"{case.setting} {case.window}", len(out) * len(names), total)
    return [w for i in range(len(suite.cases)) for w in out[i]]


def case_grid(case: SuiteCase) -> SignalGrid:
    """The realized world of one case (spot gaps filled with the replay's seeded hazard)."""
    grid = SignalGrid.build(
        case.trace,
        case.start,
        case.end,
        case.tick_s,
        keep_offer=lambda o: any(j.allows(o.gpu_type) for j in case.jobs),
    )
    return realize_spot(grid, 0)


def finishing_tick(
    run: PolicyRun, jobs: Sequence[JobSpec], grid: SignalGrid
) -> tuple[float, float]:
    """Dollars and kgCO2 billed in the ticks in which `run`'s jobs finished (whole ticks:
    run with ``bill_final_tick``): what SkyNomad's reported numbers leave out."""
    fit = JobOfferFit.build(jobs, grid.offers)
    index = {j.id: i for i, j in enumerate(jobs)}
    offer_ix = {o.id: k for k, o in enumerate(grid.offers)}
    usd = kg = 0.0
    tick_h = grid.tick_s / 3600.0
    for e in run.events:
        if e.kind is not EventKind.FINISHED:
            continue
        j, o = index[e.job_id], offer_ix[e.offer_id]
        k = min(
            grid.n_ticks - 1, max(0, math.ceil((e.time_s - grid.start_s) / grid.tick_s - 1e-9) - 1)
        )
        usd += float(grid.usd_per_hour[k, o]) * float(fit.instances[j, o]) * tick_h
        kg += (
            float(fit.power_kw[j, o])
            * float(fit.pue[o])
            * tick_h
            * float(grid.carbon_g_per_kwh[k, o])
            / 1000.0
        )
    return usd, kg


def _summarize(
    setting: str, policy: str, rows: list[WindowResult], oracle: list[WindowResult]
) -> PolicySummary:
    jobs = sum(r.jobs for r in rows)
    j_sum = sum(r.objective_usd for r in rows)
    base = sum(r.objective_usd for r in oracle)
    ratios = [(1.0 + r.regret, r) for r in rows if r.regret is not None]
    hard = [x for x, r in ratios if not r.trivial]
    worst = max(ratios, key=lambda x: x[0], default=None)
    return PolicySummary(
        setting=setting,
        policy=policy,
        jobs=jobs,
        mean_usd_per_job=sum(r.usd for r in rows) / jobs if jobs else math.nan,
        mean_kg_co2_per_job=sum(r.kg_co2 for r in rows) / jobs if jobs else math.nan,
        mean_objective_usd_per_job=j_sum / jobs if jobs else math.nan,
        deadlines_met=sum(r.deadlines_met for r in rows),
        regret=j_sum / base - 1.0 if base > 0 else None,
        windows=len(rows),
        nontrivial_windows=len(hard),
        nontrivial_mean_ratio=sum(hard) / len(hard) if hard else None,
        worst_ratio=worst[0] if worst else None,
        worst_window=(
            ""
            if worst is None
            else worst[1].window
            if len({r.setting for r in rows}) == 1
            else f"{worst[1].setting} {worst[1].window}"
        ),
    )


# --- options ------------------------------------------------------------------------------


def _options(
    suite: str, overrides: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise InputError(
            "",
            f"suite {suite!r} options",
            "one of: " + ", ".join(defaults),
            got=", ".join(unknown),
            fix="drop or rename the option",
        )
    return {**defaults, **{k: v for k, v in overrides.items() if v is not None}}


def _floats(suite: str, key: str, value: Any, *, minimum: float = 0.0) -> list[float]:
    items = (
        value.split(",")
        if isinstance(value, str)
        else (list(value) if isinstance(value, list | tuple) else [value])
    )
    try:
        out = [float(v) for v in items]
    except (TypeError, ValueError):
        raise InputError(
            "", f"suite {suite!r} option {key!r}", "a number or a list of numbers", got=repr(value)
        ) from None
    if not out or any(not math.isfinite(v) or v < minimum for v in out):
        raise InputError(
            "", f"suite {suite!r} option {key!r}", f"numbers >= {minimum:g}", got=repr(value)
        )
    return out


def _ints(suite: str, key: str, value: Any) -> list[int]:
    floats = _floats(suite, key, value)
    if any(v != int(v) for v in floats):
        raise InputError("", f"suite {suite!r} option {key!r}", "whole numbers", got=repr(value))
    return [int(v) for v in floats]


def _strings(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(v).strip() for v in items if str(v).strip()]


def _one(suite: str, key: str, value: Any, *, minimum: float = 0.0) -> float:
    values = _floats(suite, key, value, minimum=minimum)
    if len(values) != 1:
        raise InputError("", f"suite {suite!r} option {key!r}", "one number", got=repr(value))
    return values[0]


def _move_settings(
    suite: str,
    opts: Mapping[str, Any],
    *,
    transfer_default: bool,
    bill_final_tick: bool = False,
    carbon_usd_per_tonne: float = 0.0,
) -> CostSettings:
    """Egress and transfer time of a checkpoint move: options `egress_usd_per_gb` (one price
    for every cross-region move; None: the catalog's per route) and `transfer_gbps` (copies
    take time at that bandwidth; None: the suite's default, `transfer_default`: False for
    instant copies, True for the catalog's per-route bandwidth)."""
    egress = opts.get("egress_usd_per_gb")
    gbps = opts.get("transfer_gbps")
    return CostSettings(
        carbon_usd_per_tonne=carbon_usd_per_tonne,
        egress_usd_per_gb=None if egress is None else _one(suite, "egress_usd_per_gb", egress),
        transfer_time=gbps is not None or transfer_default,
        transfer_gbps=None if gbps is None else _one(suite, "transfer_gbps", gbps, minimum=1e-9),
        bill_final_tick=bill_final_tick,
    )


def _move_label(settings: CostSettings) -> str:
    egress = (
        "egress at catalog prices"
        if settings.egress_usd_per_gb is None
        else f"egress {settings.egress_usd_per_gb:g} USD/GB"
    )
    if not settings.transfer_time:
        return egress + ", instant checkpoint copies"
    if settings.transfer_gbps is None:
        return egress + ", copies at catalog bandwidth"
    return egress + f", copies at {settings.transfer_gbps:g} Gbit/s"


def _list(values: Sequence[float], fmt: str = "{:g}") -> str:
    return ", ".join(fmt.format(v) for v in values)


def _setting_label(axes: Sequence[tuple[str, float, str, bool]], single: str) -> str:
    """`name value unit` for each axis that varies (its flag), else `single`."""
    parts = [f"{name} {value:g}{unit}" for name, value, unit, varies in axes if varies]
    return ", ".join(parts) if parts else single


def _billing(suite: str, opts: Mapping[str, Any]) -> tuple[bool, bool]:
    drop, to_finish = bool(opts["drop_finishing_tick"]), bool(opts["bill_to_finish"])
    if drop and to_finish:
        raise InputError(
            "",
            f"suite {suite!r} options",
            "at most one of drop_finishing_tick and bill_to_finish",
            got="both",
        )
    return drop, to_finish


def _billing_label(drop: bool, to_finish: bool) -> str:
    if drop:
        return "finishing tick dropped (SkyNomad's reported convention)"
    return "billed to the finishing instant" if to_finish else "every tick billed"


def _require(data_dir: Path, rel: str) -> Path:
    path = data_dir / rel
    if not path.is_file():
        raise InputError(
            str(path),
            "",
            "the shared data file",
            got="missing",
            fix="point --data-dir (or HELIOTROPE_TRACES) at ../shared/data",
        )
    return path


def _yearly_carbon(data_dir: Path, zones: Iterable[str], year: int, at: datetime) -> pd.DataFrame:
    """Electricity Maps yearly life-cycle averages of `zones`, as grid samples at `at`."""
    path = data_dir / "carbon" / "electricitymaps_yearly_zone_averages_2021_2025.csv"
    if not path.is_file():
        return empty_frame("grid")
    raw = pd.read_csv(path)
    raw = raw[raw["year"] == year]
    table = dict(
        zip(
            raw["zone_id"].astype(str).tolist(),
            raw["ci_lca_gco2eq_per_kwh"].astype(float).tolist(),
            strict=True,
        )
    )
    rows = [
        {
            "time": at,
            "grid_zone": z,
            "metric": "carbon_avg_yearly_g_per_kwh",
            "value": table[z],
            "source": f"electricitymaps yearly {year}",
        }
        for z in sorted(set(zones))
        if z in table
    ]
    return pd.DataFrame(rows) if rows else empty_frame("grid")


def _changes(frame: pd.DataFrame, key: str, value: str) -> pd.DataFrame:
    """Rows of `frame` (sorted by time within `key`) where `value` changes."""
    prev = frame.groupby(key, sort=False)[value].shift()
    return frame[prev.isna() | (prev != frame[value])]


# --- skynomad-h100 ------------------------------------------------------------------------

SKYNOMAD_FILE: Final = "spot/skynomad_gcp_h100_availability_13zones_2025-10.csv.gz"
SKYNOMAD_ZONES: Final = (
    "us-central1-a",
    "us-west1-a",
    "europe-west1-c",
    "europe-west3-c",
    "asia-southeast1-b",
    "asia-south2-b",
)
SKYNOMAD_STARTS: Final = (0, 311, 622, 933, 1244, 1556)
SKYNOMAD_TICK_S: Final = 600
SKYNOMAD_DEADLINE_TICKS: Final = 311
SKYNOMAD_INSTANCE: Final = "a3-highgpu-8g"
# Published means with every tick billed (SOURCES.md): the artifact's DP and the exact oracle.
SKYNOMAD_EVERY_TICK: Final[Mapping[str, float]] = MappingProxyType(
    {
        "SkyNomad Optimal (their DP)": 574.11,
        "exact hindsight oracle": 573.04,
        "SkyNomad": 609.34,
        "UP(S)": 799.37,
    }
)

_SKYNOMAD_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "zones": list(SKYNOMAD_ZONES),
        "deadline_ratio": 1.5,
        "work_hours": None,
        "cold_start_hours": 0.2,
        "checkpoint_gb": 50.0,
        "start_ticks": list(SKYNOMAD_STARTS),
        "drop_finishing_tick": False,
        "bill_to_finish": False,
        "egress_usd_per_gb": 0.02,
        "transfer_gbps": None,
    }
)


def skynomad_h100(data_dir: Path, overrides: Mapping[str, Any]) -> Suite:
    """SkyNomad's H100 benchmark (module docstring); options in `_SKYNOMAD_DEFAULTS`.
    `deadline_ratio`, `checkpoint_gb`, `cold_start_hours` and `work_hours` may be lists:
    one setting per point of their cross product."""
    name = "skynomad-h100"
    opts = _options(name, overrides, _SKYNOMAD_DEFAULTS)
    zones = _strings(opts["zones"])
    ratios = _floats(name, "deadline_ratio", opts["deadline_ratio"], minimum=1e-9)
    ckpts = _floats(name, "checkpoint_gb", opts["checkpoint_gb"])
    colds = _floats(name, "cold_start_hours", opts["cold_start_hours"])
    starts = _ints(name, "start_ticks", opts["start_ticks"])
    drop, to_finish = _billing(name, opts)
    works: list[float | None] = (
        [None]
        if opts["work_hours"] is None
        else list(_floats(name, "work_hours", opts["work_hours"], minimum=1e-9))
    )
    settings = _move_settings(name, opts, transfer_default=False, bill_final_tick=not to_finish)
    path = _require(data_dir, SKYNOMAD_FILE)
    raw = pd.read_csv(path)
    missing = sorted(set(zones) - set(raw["zone"]))
    if missing or not zones:
        raise InputError(
            str(path),
            "zones",
            "zones of the file: " + ", ".join(sorted(set(raw["zone"]))),
            got=", ".join(missing) or "none",
        )
    raw = raw[raw["zone"].isin(zones)].copy()
    raw["time"] = pd.to_datetime(raw["time_utc"], utc=True)
    raw = raw.sort_values(["zone", "tick"], kind="stable")
    n_ticks = int(raw["tick"].max()) + 1
    t0 = pd.Timestamp(raw.loc[raw["tick"] == 0, "time"].iloc[0]).to_pydatetime()
    if any(s < 0 or s >= n_ticks for s in starts):
        raise InputError(
            "", f"suite {name!r} option 'start_ticks'", f"ticks in [0, {n_ticks})", got=starts
        )
    trace = _skynomad_trace(data_dir, raw, zones, t0)
    tick = timedelta(seconds=SKYNOMAD_TICK_S)
    data_end = t0 + n_ticks * tick
    deadline = SKYNOMAD_DEADLINE_TICKS * tick
    deadline_h = deadline.total_seconds() / 3600.0
    cases: list[SuiteCase] = []
    anchors: dict[str, dict[str, float]] = {}
    sweep = _skynomad_sweeps(data_dir)
    default_world = (
        zones == list(SKYNOMAD_ZONES)
        and starts == list(SKYNOMAD_STARTS)
        and settings.egress_usd_per_gb == 0.02
        and not settings.transfer_time
    )
    for ratio, ckpt, cold_h, work_override in itertools.product(ratios, ckpts, colds, works):
        work_h = work_override if work_override is not None else deadline_h / ratio
        setting = _setting_label(
            [
                ("ratio", ratio, "", len(ratios) > 1 or len(ckpts) > 1),
                ("ckpt", ckpt, " GB", len(ratios) > 1 or len(ckpts) > 1),
                ("cold", cold_h, " h", len(colds) > 1),
                ("work", work_h, " h", len(works) > 1),
            ],
            f"work {work_h:.3f} h",
        )
        for s in starts:
            start = t0 + s * tick
            job = JobSpec(
                id=f"t{s}",
                work_gpu_hours=work_h,
                gpus=1,
                start=start,
                # With the work given, the deadline follows it (the paper's prose setting:
                # 100 h of work, ratio 1.5 -> 150 h); else the artifact's 311 ticks.
                deadline=start
                + (timedelta(hours=work_h * ratio) if work_override is not None else deadline),
                checkpoint_size_gb=ckpt,
                cold_start_h=cold_h,
                home_region=_gcp_region(zones[0]),
                gpu_types=frozenset({"H100"}),
                throughput={"H100": 1.0},
                checkpoint_interval_h=0.0,
            )
            cases.append(
                SuiteCase(
                    setting=setting,
                    window=f"t{s}",
                    trace=trace,
                    jobs=(job,),
                    tick_s=SKYNOMAD_TICK_S,
                    start=start,
                    end=min(start + 2 * (job.deadline - start), max(data_end, job.deadline)),
                    settings=settings,
                    drop_finishing_tick=drop,
                )
            )
        if default_world and cold_h == 0.2 and work_override is None and not to_finish:
            found = _skynomad_anchor(sweep, ratio, ckpt, drop)
            if found:
                anchors[setting] = found
    if works == [None]:
        shape = (
            f"deadline {deadline_h:.3f} h ({SKYNOMAD_DEADLINE_TICKS} ticks), work = "
            f"deadline / ratio {_list(ratios)} ("
            + _list([deadline_h / r for r in ratios], "{:.3f}")
            + " h)"
        )
    else:
        shape = (
            f"work {_list([w for w in works if w is not None])} h, deadline = work x "
            f"ratio {_list(ratios)}"
        )
    return Suite(
        name=name,
        description=(
            "SkyNomad H100 (arXiv 2601.06520 artifact): GCP a3-highgpu-8g, "
            f"{len(zones)} zones, 600 s ticks, {len(starts)} windows, {shape}, "
            f"cold start {_list(colds)} h, checkpoint {_list(ckpts)} GB, "
            f"{_move_label(settings)}, {_billing_label(drop, to_finish)}"
        ),
        cases=tuple(cases),
        config={
            "zones": zones,
            "deadline_ratio": ratios,
            "work_hours": None if works == [None] else works,
            "cold_start_hours": colds,
            "checkpoint_gb": ckpts,
            "start_ticks": starts,
            "drop_finishing_tick": drop,
            "bill_to_finish": to_finish,
            "tick_s": SKYNOMAD_TICK_S,
            "deadline_ticks": SKYNOMAD_DEADLINE_TICKS,
            "egress_usd_per_gb": settings.egress_usd_per_gb,
            "transfer_time": settings.transfer_time,
            "transfer_gbps": settings.transfer_gbps,
            "checkpoint_interval_h": 0.0,
            "data": str(path),
        },
        anchors=anchors,
    )


def _gcp_region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _skynomad_trace(data_dir: Path, raw: pd.DataFrame, zones: Sequence[str], t0: datetime) -> Trace:
    regions = {z: _gcp_region(z) for z in zones}
    offers = pd.DataFrame(
        [
            {
                "cloud": "gcp",
                "region": regions[z],
                "zone": z,
                "instance_type": SKYNOMAD_INSTANCE,
                "gpu_type": "H100",
                "gpu_count": 8,
                "grid_zone": "",
            }
            for z in zones
        ]
    )
    first = raw[raw["tick"] == 0]
    listed = {
        (str(z), col): float(v)
        for col in ("spot_usd_per_hour", "ondemand_usd_per_hour")
        for z, v in zip(first["zone"].tolist(), first[col].tolist(), strict=True)
    }
    prices = pd.DataFrame(
        [
            {
                "time": t0,
                "cloud": "gcp",
                "region": regions[z],
                "zone": z,
                "instance_type": SKYNOMAD_INSTANCE,
                "market": market,
                "usd_per_hour": listed[(z, col)],
            }
            for z in zones
            for market, col in (
                ("spot", "spot_usd_per_hour"),
                ("on_demand", "ondemand_usd_per_hour"),
            )
        ]
    )
    changes = _changes(raw, "zone", "available")
    spot = pd.DataFrame(
        {
            "time": changes["time"],
            "cloud": "gcp",
            "zone": changes["zone"],
            "instance_type": SKYNOMAD_INSTANCE,
            "capacity": changes["available"].astype(float),
        }
    )
    grid_zones = [catalog.grid_zone("gcp", r) or "" for r in regions.values()]
    grid = _yearly_carbon(data_dir, grid_zones, 2024, t0)
    return Trace(
        offers=offers,
        prices=prices,
        spot=spot.reset_index(drop=True),
        grid=grid,
        manifest=make_manifest(
            generator="suite skynomad-h100", sources=[{"file": SKYNOMAD_FILE}], start=t0.isoformat()
        ),
    )


def _skynomad_sweeps(data_dir: Path) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    for key in ("deadline_sensitivity", "checkpoint_sensitivity"):
        path = data_dir / "anchors" / f"skynomad_{key}.csv"
        if path.is_file():
            out[key] = pd.read_csv(path)
    return out


def _skynomad_anchor(
    sweeps: Mapping[str, pd.DataFrame], ratio: float, ckpt: float, drop: bool
) -> dict[str, float]:
    """Published numbers for this setting: every-tick means for the default setting; the
    deadline (checkpoint 50 GB) and checkpoint (ratio 1.2) sweeps in the reported
    convention (finishing tick dropped)."""
    if not drop:
        return dict(SKYNOMAD_EVERY_TICK) if (ratio == 1.5 and ckpt == 50.0) else {}
    frame, col, value = None, "", 0.0
    if ckpt == 50.0 and "deadline_sensitivity" in sweeps:
        frame, col, value = sweeps["deadline_sensitivity"], "deadline_ratio", ratio
    elif ratio == 1.2 and "checkpoint_sensitivity" in sweeps:
        frame, col, value = sweeps["checkpoint_sensitivity"], "checkpoint_size", ckpt
    if frame is None:
        return {}
    rows = frame[np.isclose(frame[col].astype(float), value)]
    out: dict[str, float] = {}
    for strategy, row in rows.set_index("strategy").iterrows():
        label = "SkyNomad Optimal" if strategy == "Optimal" else str(strategy)
        out[f"{label} mean"] = float(row["mean"])
        if strategy == "Optimal":
            out["SkyNomad Optimal p5"] = float(row["p5"])
            out["SkyNomad Optimal p95"] = float(row["p95"])
    return out


# --- cbl-v100 -----------------------------------------------------------------------------

CBL_SEGMENTS: Final = "spot/spot_traces_segments.csv.gz"
CBL_PRICES: Final = "spot/skynomad_aws_v100_spot_price_per_tick_9zones_2023-02.csv.gz"
CBL_ZONES: Final = (
    "us-east-1a",
    "us-east-1c",
    "us-east-1d",
    "us-east-1f",
    "us-east-2a",
    "us-east-2b",
    "us-west-2a",
    "us-west-2b",
    "us-west-2c",
)
CBL_TRACE: Final = "cbl/availability/1-node/aws-02-15-2023/{zone}_v100_1"
CBL_START: Final = datetime(2023, 2, 15, tzinfo=UTC)  # the files carry only the date
CBL_TICK_S: Final = 195
CBL_ON_DEMAND_USD_PER_HOUR: Final = 3.06  # p3.2xlarge, us-east-1 list price
CBL_INSTANCE: Final = "p3.2xlarge"

_CBL_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "zones": list(CBL_ZONES),
        "work_hours": 48.0,
        "slack_hours": [4.0, 22.0],
        "cold_start_hours": [0.05, 0.2],
        "checkpoint_gb": 50.0,
        "start_ticks": [0, 3100, 6200, 9300, 12400, 15500],
        "drop_finishing_tick": False,
        "bill_to_finish": False,
        "deadline_ratio": None,
        "egress_usd_per_gb": 0.02,
        "transfer_gbps": None,
    }
)


def cbl_v100(data_dir: Path, overrides: Mapping[str, Any]) -> Suite:
    """Can't Be Late's AWS V100 traces with SkyNomad's spot prices (module docstring).
    `work_hours`, `slack_hours` (or instead `deadline_ratio`: slack = work x (ratio - 1)),
    `cold_start_hours` and `checkpoint_gb` may be lists: one setting per point of their
    cross product."""
    name = "cbl-v100"
    opts = _options(name, overrides, _CBL_DEFAULTS)
    zones = _strings(opts["zones"])
    works = _floats(name, "work_hours", opts["work_hours"], minimum=1e-9)
    by_ratio = opts["deadline_ratio"] is not None
    if by_ratio and overrides.get("slack_hours") is not None:
        raise InputError(
            "",
            f"suite {name!r} options",
            "slack_hours or deadline_ratio",
            got="both",
            fix="give the deadline one way",
        )
    slacks = (
        _floats(name, "deadline_ratio", opts["deadline_ratio"], minimum=1.0)
        if by_ratio
        else _floats(name, "slack_hours", opts["slack_hours"])
    )
    colds = _floats(name, "cold_start_hours", opts["cold_start_hours"])
    ckpts = _floats(name, "checkpoint_gb", opts["checkpoint_gb"])
    starts = _ints(name, "start_ticks", opts["start_ticks"])
    drop, to_finish = _billing(name, opts)
    settings = _move_settings(name, opts, transfer_default=False, bill_final_tick=not to_finish)
    seg_path = _require(data_dir, CBL_SEGMENTS)
    price_path = _require(data_dir, CBL_PRICES)
    bad = sorted(set(zones) - set(CBL_ZONES))
    if bad or not zones:
        raise InputError(
            "",
            f"suite {name!r} option 'zones'",
            "zones of: " + ", ".join(CBL_ZONES),
            got=", ".join(bad) or "none",
        )
    segments = pd.read_csv(seg_path)
    prices = pd.read_csv(price_path)
    n_ticks = int(prices["tick"].max()) + 1
    trace = _cbl_trace(data_dir, segments, prices, zones)
    tick = timedelta(seconds=CBL_TICK_S)
    data_end = CBL_START + n_ticks * tick
    cases: list[SuiteCase] = []
    for slack_or_ratio, cold, work_h, ckpt in itertools.product(slacks, colds, works, ckpts):
        slack = work_h * (slack_or_ratio - 1.0) if by_ratio else slack_or_ratio
        setting = (f"ratio {slack_or_ratio:g}" if by_ratio else f"slack {slack:g} h") + (
            f", cold {cold:g} h"
            + (f", work {work_h:g} h" if len(works) > 1 else "")
            + (f", ckpt {ckpt:g} GB" if len(ckpts) > 1 else "")
        )
        window = timedelta(hours=work_h + slack)
        for s in starts:
            start = CBL_START + s * tick
            if start + window > data_end:
                raise InputError(
                    "",
                    f"suite {name!r} option 'start_ticks'",
                    "windows inside the trace",
                    got=s,
                    fix=f"start before tick {n_ticks} minus the window",
                )
            job = JobSpec(
                id=f"t{s}",
                work_gpu_hours=work_h,
                gpus=1,
                start=start,
                deadline=start + window,
                checkpoint_size_gb=ckpt,
                cold_start_h=cold,
                home_region=zones[0][:-1],
                gpu_types=frozenset({"V100"}),
                throughput={"V100": 1.0},
                checkpoint_interval_h=0.0,
            )
            cases.append(
                SuiteCase(
                    setting=setting,
                    window=f"t{s}",
                    trace=trace,
                    jobs=(job,),
                    tick_s=CBL_TICK_S,
                    start=start,
                    end=min(start + 2 * window, max(data_end, start + window)),
                    settings=settings,
                    drop_finishing_tick=drop,
                )
            )
    deadline = (
        f"deadline = work x ratio {_list(slacks)}" if by_ratio else f"slack {_list(slacks)} h"
    )
    return Suite(
        name=name,
        description=(
            f"Can't Be Late AWS V100 (p3.2xlarge), {len(zones)} zones, 195 s ticks, "
            f"{len(starts)} windows, work {_list(works)} h, {deadline}, cold start "
            f"{_list(colds)} h, checkpoint {_list(ckpts)} GB, "
            f"{_move_label(settings)}, {_billing_label(drop, to_finish)}"
        ),
        cases=tuple(cases),
        config={
            "zones": zones,
            "work_hours": works,
            "slack_hours": None if by_ratio else slacks,
            "deadline_ratio": slacks if by_ratio else None,
            "cold_start_hours": colds,
            "checkpoint_gb": ckpts,
            "start_ticks": starts,
            "drop_finishing_tick": drop,
            "bill_to_finish": to_finish,
            "tick_s": CBL_TICK_S,
            "on_demand_usd_per_hour": CBL_ON_DEMAND_USD_PER_HOUR,
            "egress_usd_per_gb": settings.egress_usd_per_gb,
            "transfer_time": settings.transfer_time,
            "transfer_gbps": settings.transfer_gbps,
            "checkpoint_interval_h": 0.0,
            "trace_start": CBL_START.isoformat(),
            "data": [str(seg_path), str(price_path)],
        },
    )


def _cbl_trace(
    data_dir: Path, segments: pd.DataFrame, prices: pd.DataFrame, zones: Sequence[str]
) -> Trace:
    regions = {z: z[:-1] for z in zones}
    offers = pd.DataFrame(
        [
            {
                "cloud": "aws",
                "region": regions[z],
                "zone": z,
                "instance_type": CBL_INSTANCE,
                "gpu_type": "V100",
                "gpu_count": 1,
                "grid_zone": "",
            }
            for z in zones
        ]
    )
    tick = pd.Timedelta(seconds=CBL_TICK_S)
    t0 = pd.Timestamp(CBL_START)
    p = prices[prices["zone"].isin(zones)].sort_values(["zone", "tick"], kind="stable")
    p = _changes(p, "zone", "spot_usd_per_hour")
    price_rows = pd.concat(
        [
            pd.DataFrame(
                {
                    "time": t0 + p["tick"].to_numpy() * tick,
                    "cloud": "aws",
                    "region": p["zone"].map(regions),
                    "zone": p["zone"],
                    "instance_type": CBL_INSTANCE,
                    "market": "spot",
                    "usd_per_hour": p["spot_usd_per_hour"].astype(float),
                }
            ),
            pd.DataFrame(
                [
                    {
                        "time": CBL_START,
                        "cloud": "aws",
                        "region": regions[z],
                        "zone": z,
                        "instance_type": CBL_INSTANCE,
                        "market": "on_demand",
                        "usd_per_hour": CBL_ON_DEMAND_USD_PER_HOUR,
                    }
                    for z in zones
                ]
            ),
        ],
        ignore_index=True,
    )
    ids = {CBL_TRACE.format(zone=z): z for z in zones}
    seg = segments[segments["trace_id"].isin(ids)].sort_values(["trace_id", "start_tick"])
    missing = sorted(set(ids) - set(seg["trace_id"]))
    if missing:
        raise InputError(
            CBL_SEGMENTS,
            "trace_id",
            "the Can't Be Late 2023-02-15 V100 traces",
            got="missing " + ", ".join(missing),
        )
    spot = pd.DataFrame(
        {
            "time": t0 + seg["start_tick"].to_numpy() * tick,
            "cloud": "aws",
            "zone": seg["trace_id"].map(ids),
            "instance_type": CBL_INSTANCE,
            "capacity": seg["value"].astype(float),
        }
    )
    grid_zones = [catalog.grid_zone("aws", r) or "" for r in regions.values()]
    grid = _yearly_carbon(data_dir, grid_zones, 2023, CBL_START)
    return Trace(
        offers=offers,
        prices=price_rows,
        spot=spot.reset_index(drop=True),
        grid=grid,
        manifest=make_manifest(
            generator="suite cbl-v100",
            sources=[{"file": CBL_SEGMENTS}, {"file": CBL_PRICES}],
            start=CBL_START.isoformat(),
        ),
    )


_CARBON_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "carbon_prices": [0.0, 50.0, 200.0],
        "windows": 10,
        "jobs_per_window": 20,
        "window_days": 8.0,
        "seed": 0,
        "egress_usd_per_gb": None,
        "transfer_gbps": None,
    }
)
# The oracle's progress grid for carbon-year: 4,096 levels instead of 16,384 gave the same J
# to the cent on 8 jobs of the first window at 200 USD/t, 2.5x faster (docs/policies.md).
CARBON_ORACLE_LEVELS: Final = 4096
CARBON_GPUS: Final = frozenset({"A100-40GB", "A100-80GB", "H100", "L4"})
# One single-GPU and one 8-GPU shape per GPU type (GCP's list has ~15 shapes per region).
CARBON_TYPES: Final = frozenset(
    {
        "a2-highgpu-1g",
        "a2-highgpu-8g",
        "a2-ultragpu-1g",
        "a2-ultragpu-8g",
        "a3-highgpu-8g",
        "g2-standard-4",
        "g2-standard-96",
    }
)


def carbon_year(data_dir: Path, overrides: Mapping[str, Any]) -> Suite:
    """GCP A100/H100/L4 on their real price history, May 2023 to December 2024, in the
    regions whose grid zone has an hourly carbon series (Electricity Maps), with the
    negative wholesale price as the curtailment proxy. `windows` windows of `window_days`
    spread over the period, `jobs_per_window` seeded jobs each (200 in all by default):
    1 or 8 GPUs, A100/H100 or L4/A100 allowed, 1.5-3x slack on the fastest offer,
    checkpoints of 20-200 GB. One setting per carbon price. GCP spot availability has no
    trace in that period: the replay's seeded hazard fills it (providers.sim: calibrated on
    the Can't Be Late V100 traces, 60 % available, outages of hours). Shapes the price source
    lists at the bare VM's price in some region are left out there (`_unpriced_gpu_regions`)."""
    from orchestrator.signals.importers import import_shared_data

    name = "carbon-year"
    opts = _options(name, overrides, _CARBON_DEFAULTS)
    prices = _floats(name, "carbon_prices", opts["carbon_prices"])
    n_windows = int(_one(name, "windows", opts["windows"], minimum=1))
    per_window = int(_one(name, "jobs_per_window", opts["jobs_per_window"], minimum=1))
    days = _one(name, "window_days", opts["window_days"], minimum=1)
    seed = int(opts["seed"])
    full = import_shared_data(Path(data_dir))
    hourly = set(full.grid.loc[full.grid["metric"] == "carbon_avg_g_per_kwh", "grid_zone"])
    offers = full.offers[
        (full.offers["cloud"] == "gcp")
        & full.offers["gpu_type"].isin(CARBON_GPUS)
        & full.offers["instance_type"].isin(CARBON_TYPES)
        & full.offers["grid_zone"].isin(hourly)
    ].reset_index(drop=True)
    if offers.empty:
        raise InputError(
            str(data_dir),
            "carbon-year offers",
            "GCP A100/H100/L4 offers in zones with hourly carbon",
            got="none",
        )
    keys = set(zip(offers["cloud"], offers["region"], offers["instance_type"], strict=True))
    price_rows = full.prices[
        [
            (c, r, i) in keys
            for c, r, i in zip(
                full.prices["cloud"],
                full.prices["region"],
                full.prices["instance_type"],
                strict=True,
            )
        ]
    ]
    unpriced_gpu = _unpriced_gpu_regions(price_rows)
    if unpriced_gpu:
        offers = offers[
            [
                (r, i) not in unpriced_gpu
                for r, i in zip(offers["region"], offers["instance_type"], strict=True)
            ]
        ].reset_index(drop=True)
        price_rows = price_rows[
            [
                (r, i) not in unpriced_gpu
                for r, i in zip(price_rows["region"], price_rows["instance_type"], strict=True)
            ]
        ]
    zones = set(offers["grid_zone"])
    trace = Trace(
        offers=offers,
        prices=price_rows.reset_index(drop=True),
        spot=empty_frame("spot"),
        grid=full.grid[full.grid["grid_zone"].isin(zones)].reset_index(drop=True),
        manifest=full.manifest,
    )
    regions = sorted(set(offers["region"]))
    first, last = datetime(2023, 5, 8, tzinfo=UTC), datetime(2024, 12, 20, tzinfo=UTC)
    step = (last - first - timedelta(days=days)) / max(1, n_windows - 1)
    rng = np.random.default_rng(seed)
    windows: list[tuple[str, datetime, tuple[JobSpec, ...]]] = []
    for w in range(n_windows):
        w_start = (first + step * w).replace(minute=0, second=0, microsecond=0)
        jobs = []
        for i in range(per_window):
            gpus = int(rng.choice([1, 8]))
            types = (
                frozenset({"A100-40GB", "A100-80GB", "H100"})
                if rng.random() < 0.6
                else frozenset({"L4", "A100-80GB"})
            )
            work = float(rng.uniform(4, 36)) * gpus  # 4-36 h on A100s
            # Slack is measured on A100-80GB speed: every window has it (H100 shapes arrive
            # in GCP's list only later in 2023), so every deadline is feasible.
            fastest_h = work / (gpus * catalog.gpu("A100-80GB").relative_throughput)
            start = w_start + timedelta(hours=float(rng.uniform(0, 24)))
            slack = float(rng.uniform(1.5, 3.0))
            deadline = start + timedelta(hours=min(fastest_h * slack + 1.0, days * 24 - 30))
            jobs.append(
                JobSpec(
                    id=f"w{w:02d}-j{i:03d}",
                    work_gpu_hours=work,
                    gpus=gpus,
                    start=start,
                    deadline=deadline,
                    checkpoint_size_gb=float(rng.uniform(20, 200)),
                    cold_start_h=0.2,
                    home_region=regions[int(rng.integers(len(regions)))],
                    gpu_types=types,
                    checkpoint_interval_h=1.0,
                )
            )
        windows.append((f"{w_start:%Y-%m-%d}", w_start, tuple(jobs)))
    cases = tuple(
        SuiteCase(
            setting=f"carbon {price:g} USD/t",
            window=label,
            trace=trace,
            jobs=jobs,
            tick_s=1800,
            start=w_start,
            end=w_start + timedelta(days=days),
            settings=_move_settings(name, opts, transfer_default=True, carbon_usd_per_tonne=price),
        )
        for price in prices
        for label, w_start, jobs in windows
    )
    return Suite(
        name=name,
        description=(
            f"GCP A100/H100/L4, real prices and hourly carbon, 2023-05..2024-12, "
            f"{n_windows} windows of {days:g} days, {n_windows * per_window} jobs "
            f"(seed {seed}), 30-minute ticks, carbon price {_list(prices)} USD/t, "
            f"{_move_label(cases[0].settings)}"
        ),
        cases=cases,
        config={
            "carbon_prices": prices,
            "windows": n_windows,
            "jobs_per_window": per_window,
            "window_days": days,
            "seed": seed,
            "regions": regions,
            "egress_usd_per_gb": cases[0].settings.egress_usd_per_gb,
            "transfer_gbps": cases[0].settings.transfer_gbps,
            "oracle_levels": CARBON_ORACLE_LEVELS,
            "dropped_unpriced_gpu": sorted(f"{r} {i}" for r, i in unpriced_gpu),
        },
        oracle_levels=CARBON_ORACLE_LEVELS,
    )


UNPRICED_GPU_RATIO: Final = 0.4


def _unpriced_gpu_regions(prices: pd.DataFrame) -> set[tuple[str, str]]:
    """(region, instance type) whose on-demand price is under `UNPRICED_GPU_RATIO` of the
    type's median over regions: the source priced the VM without its GPUs (SkyPilot's GCP
    catalog lists a2-highgpu-1g in northamerica-northeast2 at 0.81 USD/h, 3.67 to 5.88
    elsewhere). Such a region would be a bargain that does not exist."""
    od = prices[prices["market"] == "on_demand"]
    if od.empty:
        return set()
    per_region = od.groupby(["instance_type", "region"])["usd_per_hour"].median()
    typical = per_region.groupby(level="instance_type").median()
    ratio = (
        per_region / typical.reindex(per_region.index.get_level_values("instance_type")).to_numpy()
    )
    return {(str(r), str(i)) for (i, r), v in ratio.items() if v < UNPRICED_GPU_RATIO}


SUITES: Final[Mapping[str, SuiteFactory]] = MappingProxyType(
    {
        "skynomad-h100": skynomad_h100,
        "cbl-v100": cbl_v100,
        "carbon-year": carbon_year,
    }
)


def write_suite_outputs(result: SuiteResult, out_dir: Path) -> dict[str, Path]:
    """`results.json` and `pareto.png` (mean USD vs kgCO2 per job, one point per policy and
    setting) in `out_dir`."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.json"
    results.write_text(json.dumps(result.to_json(), indent=2))
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    settings = result.settings()
    for policy in result.policies:
        xs = [result.policy(policy, s).mean_usd_per_job for s in settings]
        ys = [result.policy(policy, s).mean_kg_co2_per_job for s in settings]
        ax.plot(xs, ys, marker="o", linestyle="-" if len(xs) > 1 else "", label=policy)
    ax.set_xlabel("USD per job")
    ax.set_ylabel("kgCO2 per job (location-based)")
    ax.set_title(
        f"{result.suite}: cost vs carbon per policy"
        + (" (one point per setting)" if len(settings) > 1 else "")
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    pareto = out_dir / "pareto.png"
    fig.savefig(pareto)
    plt.close(fig)
    return {"results": results, "pareto": pareto}
