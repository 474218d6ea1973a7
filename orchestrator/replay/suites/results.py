"""Suite results: one row per policy and window, summaries per setting and over the suite."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


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

    def to_json(self) -> dict[str, Any]:
        """The row as results.json's `windows` hold it (`from_json` reads it back)."""
        return {
            "setting": self.setting,
            "window": self.window,
            "policy": self.policy,
            "jobs": self.jobs,
            "usd": rounded(self.usd, 4),
            "kg_co2": rounded(self.kg_co2, 4),
            "finishing_tick_usd_dropped": rounded(self.finishing_tick_usd, 4),
            "objective_usd": rounded(self.objective_usd, 4),
            "deadlines_met": self.deadlines_met,
            "finished": self.finished,
            "preemptions": self.preemptions,
            "migrations": self.migrations,
            "launches": self.launches,
            "regret": rounded(self.regret, 6),
            "trivial": self.trivial,
        }

    @staticmethod
    def from_json(row: Mapping[str, Any]) -> WindowResult:
        """A row of results.json's `windows`; KeyError, TypeError or ValueError where it is
        not one."""
        regret = row["regret"]
        return WindowResult(
            setting=str(row["setting"]),
            window=str(row["window"]),
            policy=str(row["policy"]),
            jobs=int(row["jobs"]),
            usd=float(row["usd"]),
            kg_co2=float(row["kg_co2"]),
            finishing_tick_usd=float(row["finishing_tick_usd_dropped"]),
            objective_usd=float(row["objective_usd"]),
            deadlines_met=int(row["deadlines_met"]),
            finished=int(row["finished"]),
            preemptions=int(row["preemptions"]),
            migrations=int(row["migrations"]),
            launches=int(row["launches"]),
            regret=None if regret is None else float(regret),
            trivial=bool(row["trivial"]),
        )


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
                    "mean_usd_per_job": rounded(r.mean_usd_per_job, 4),
                    "mean_kg_co2_per_job": rounded(r.mean_kg_co2_per_job, 4),
                    "mean_objective_usd_per_job": rounded(r.mean_objective_usd_per_job, 4),
                    "deadlines_met": r.deadlines_met,
                    "deadlines_total": r.jobs,
                    "regret": rounded(r.regret, 6),
                    "windows": r.windows,
                    "nontrivial_windows": r.nontrivial_windows,
                    "nontrivial_mean_ratio": rounded(r.nontrivial_mean_ratio, 6),
                    "worst_ratio": rounded(r.worst_ratio, 6),
                    "worst_window": r.worst_window,
                }
                for r in rows
            ]

        return {
            "suite": self.suite,
            "description": self.description,
            "config": jsonable(self.config),
            "policies": list(self.policies),
            "summary": summary(self.summary),
            "by_setting": summary(self.by_setting),
            "windows": [w.to_json() for w in self.windows],
            "anchors": {s: dict(a) for s, a in self.anchors.items()},
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def format_table(self) -> str:
        """Plain-text tables (`orchestrator.replay.suites.table.format_table`)."""
        from orchestrator.replay.suites.table import format_table

        return format_table(self)


def rounded(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, float | int | str | bool) or value is None:
        return value
    return str(value)


def summarize(
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
