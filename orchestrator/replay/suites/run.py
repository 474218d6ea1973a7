"""`run_suite`: every case of a suite under the chosen policies and the oracle, summarized."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.errors import InputError
from orchestrator.replay.suites.base import ORACLE, Suite, SuiteProgress
from orchestrator.replay.suites.case import run_case
from orchestrator.replay.suites.pool import run_cases_in_pool
from orchestrator.replay.suites.registry import policy_names, suite_factory
from orchestrator.replay.suites.results import SuiteResult, WindowResult, jsonable, summarize


def run_suite(
    name: str,
    data_dir: Path,
    policies: Sequence[str],
    overrides: Mapping[str, Any] | None = None,
    progress: SuiteProgress | None = None,
    workers: int = 1,
    oracle_from: Path | None = None,
) -> SuiteResult:
    """Run `policies` (registry names) and the oracle over suite `name`'s cases, the cases
    spread over `workers` processes (each builds the suite once; results are the same).

    `oracle_from`: the results.json of an earlier run of the same suite and options; its
    oracle rows stand in for the oracle's runs (most of a suite's time), so policy variants
    are measured against it in seconds. Refused where the suite, its description or its
    config differ, or a window is missing."""
    factory = suite_factory(name)
    if workers < 1:
        raise InputError("", "workers", "a whole number >= 1", got=workers)
    names = policy_names(policies)
    t_start = time.perf_counter()
    options = dict(overrides or {})
    suite = factory(Path(data_dir), options)
    stored: dict[tuple[str, str], WindowResult] | None = None
    if oracle_from is not None:
        stored = stored_oracle(Path(oracle_from), suite)
        names = tuple(n for n in names if n != ORACLE)
        if not names:
            raise InputError(
                "", "policies", "a policy besides the oracle (its rows are read, not run)"
            )
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
    description = suite.description
    if stored is not None:
        windows = against_stored(windows, stored)
        names = (ORACLE, *names)
        description += f"; oracle read from {oracle_from}"
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
        description=description,
        config=suite.config,
        policies=names,
        summary=summary,
        by_setting=by_setting,
        windows=tuple(windows),
        anchors=suite.anchors,
        elapsed_s=time.perf_counter() - t_start,
    )


def stored_oracle(path: Path, suite: Suite) -> dict[tuple[str, str], WindowResult]:
    """The oracle's rows of the results.json at `path`, per (setting, window) of `suite`'s
    cases; refused unless it is a run of the same suite with the same options."""
    where, field = str(path), "--oracle-from"
    fix = "run the suite without --oracle-from once, then pass its results.json"
    try:
        data = json.loads(path.read_text())
        rows = {
            (w.setting, w.window): w
            for w in map(WindowResult.from_json, data["windows"])
            if w.policy == ORACLE
        }
        same = (
            data["suite"] == suite.name
            and data["description"].split("; oracle read from ")[0] == suite.description
            and data["config"] == jsonable(suite.config)
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(where, field, "a suite's results.json", got=str(e), fix=fix) from None
    if not same:
        raise InputError(
            where,
            field,
            f"results of suite {suite.name} with the same options ({suite.description})",
            got=f"{data.get('suite')}: {data.get('description')}",
            fix=fix,
        )
    out: dict[tuple[str, str], WindowResult] = {}
    for case in suite.cases:
        w = rows.get((case.setting, case.window))
        if w is None:
            raise InputError(
                where, field, f"an oracle row for {case.setting} {case.window}", fix=fix
            )
        out[(case.setting, case.window)] = w
    return out


def against_stored(
    windows: list[WindowResult], stored: dict[tuple[str, str], WindowResult]
) -> list[WindowResult]:
    """Each case's stored oracle row first, then the policies' rows with their regret
    against it (in the order the oracle's own runs would have given)."""
    out: list[WindowResult] = []
    seen: set[tuple[str, str]] = set()
    for w in windows:
        key = (w.setting, w.window)
        oracle = stored[key]
        if key not in seen:
            seen.add(key)
            out.append(oracle)
        base = oracle.objective_usd
        out.append(
            dataclasses.replace(
                w,
                regret=w.objective_usd / base - 1.0 if base > 0 and math.isfinite(base) else None,
                trivial=oracle.trivial,
            )
        )
    return out
