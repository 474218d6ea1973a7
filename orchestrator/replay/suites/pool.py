"""A suite's cases spread over worker processes: each builds the suite once, runs the cases
it is given; the results are the same as in one process, in the same order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.replay.suites.base import Suite, SuiteProgress
from orchestrator.replay.suites.case import run_case
from orchestrator.replay.suites.registry import SUITES
from orchestrator.replay.suites.results import WindowResult

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


def run_cases_in_pool(
    name: str,
    data_dir: Path,
    overrides: dict[str, Any],
    suite: Suite,
    names: tuple[str, ...],
    workers: int,
    progress: SuiteProgress | None,
    total: int,
) -> list[WindowResult]:
    """Every case of `suite` (built as `name` with `overrides`) on up to `workers` spawned
    processes; `progress` as each case ends."""
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
