"""`suite_timelines` (``--timeline JOB[@WINDOW]``): where one job was, tick by tick, under
each policy beside the oracle."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.loop import LoopOptions
from orchestrator.model import FleetState, Market, Phase
from orchestrator.replay.runner import run_policy
from orchestrator.replay.suites.base import SuiteCase
from orchestrator.replay.suites.case import case_grid, case_policy
from orchestrator.replay.suites.registry import policy_names, suite_factory


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
    factory = suite_factory(name)
    names = policy_names(policies)
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
            case_policy(n, case, grid, oracle_levels),
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
