"""A suite's cases spread over worker processes: each builds the suite once, runs the cases
it is given; the results are the same as in one process, in the same order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.replay.suites.base import Suite, SuiteCase, SuiteProgress
from orchestrator.replay.suites.case import run_case
from orchestrator.replay.suites.registry import SUITES
from orchestrator.replay.suites.results import WindowResult

T = TypeVar("T")

_WORKER_SUITE: dict[str, Suite] = {}


def _worker_case(
    name: str,
    data_dir: Path,
    overrides: dict[str, Any],
    index: int,
    work: Callable[..., T],
    args: tuple[Any, ...],
) -> T:
    """`work(case, *args)` on one case in a worker process: the suite is built once per
    process."""
    key = repr((name, str(data_dir), sorted(overrides.items())))
    suite = _WORKER_SUITE.get(key)
    if suite is None:
        suite = _WORKER_SUITE[key] = SUITES[name](data_dir, overrides)
    return work(suite.cases[index], *args)


def map_cases(
    name: str,
    data_dir: Path,
    overrides: dict[str, Any],
    suite: Suite,
    indices: Sequence[int],
    work: Callable[..., T],
    args: tuple[Any, ...],
    workers: int,
    done: Callable[[int, int], None] | None = None,
) -> dict[int, T]:
    """`work(case, *args)` (a module-level function) for the cases `indices` of `suite`
    (built as `name` with `overrides`): in this process with one worker, else on up to
    `workers` spawned processes; `done(index, count done)` as each case ends."""
    out: dict[int, T] = {}
    if workers <= 1 or len(indices) <= 1:
        for i in indices:
            out[i] = work(suite.cases[i], *args)
            if done is not None:
                done(i, len(out))
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    context = multiprocessing.get_context("spawn")  # no fork of a threaded parent
    with ProcessPoolExecutor(max_workers=min(workers, len(indices)), mp_context=context) as pool:
        futures = {
            pool.submit(_worker_case, name, data_dir, overrides, i, work, args): i for i in indices
        }
        for future in as_completed(futures):
            i = futures[future]
            out[i] = future.result()
            if done is not None:
                done(i, len(out))
    return out


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

    def done(i: int, count: int) -> None:
        if progress is not None:
            case: SuiteCase = suite.cases[i]
            progress(f"{case.setting} {case.window}", count * len(names), total)

    indices = range(len(suite.cases))
    out = map_cases(
        name,
        data_dir,
        overrides,
        suite,
        indices,
        run_case,
        (names, suite.oracle_levels),
        workers,
        done,
    )
    return [w for i in indices for w in out[i]]
