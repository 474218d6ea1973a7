"""`run_suite`: every case of a suite under the chosen policies and the oracle, summarized."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.replay.suites.base import ORACLE, SuiteProgress
from orchestrator.replay.suites.case import run_case
from orchestrator.replay.suites.pool import run_cases_in_pool
from orchestrator.replay.suites.registry import policy_names, suite_factory
from orchestrator.replay.suites.results import SuiteResult, WindowResult, summarize


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
    factory = suite_factory(name)
    if workers < 1:
        raise InputError("", "workers", "a whole number >= 1", got=workers)
    names = policy_names(policies)
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
        windows = run_cases_in_pool(
            name, Path(data_dir), options, suite, names, workers, progress, total
        )
    if progress is not None:
        progress("done", total, total)
    settings = tuple(dict.fromkeys(c.setting for c in suite.cases))
    by_setting = tuple(
        summarize(
            s,
            n,
            [w for w in windows if w.setting == s and w.policy == n],
            [w for w in windows if w.setting == s and w.policy == ORACLE],
        )
        for s in settings
        for n in names
    )
    summary = tuple(
        summarize(
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
