"""What a suite is: named settings, each a set of windows (one replay each)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from orchestrator.model import CostSettings, JobSpec
from orchestrator.signals.traces import Trace
from providers.sim import DEFAULT_LOSS_PER_HOUR

SuiteProgress = Callable[[str, int, int], None]  # what is running, runs done, runs total

#: The hindsight oracle: always run, regret is measured against it.
ORACLE: Final = "oracle"


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
    drop_finishing_tick: bool = False  # report SkyNomad's convention (package docstring)
    # Unknown spot capacity is filled by the seeded hazard (`providers.sim.realize_spot`)
    # lost at this rate per hour; 0: up throughout (carbon-year's `spot_loss_per_hour`).
    spot_loss_per_hour: float = DEFAULT_LOSS_PER_HOUR


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
