"""Benchmark suites as code: named settings that `heliotrope bench policies --suite NAME` runs.

A suite builds its trace in memory from ``../shared/data`` (never copied into the
repository), one or more *settings* (a sweep point) and, per setting, *windows* (one replay
each, usually one job). Every policy, the oracle included, is accounted by the same loop
(`orchestrator.replay.runner.run_policy`) on the same realized grid; the oracle is always
run, because regret ``J(policy) / J(oracle) - 1`` is measured against it.

One module per suite (`skynomad_h100`, `cbl_v100`, `carbon_year`: its pydantic options, its
trace and cases); `base` (what a suite and a case are), `options` (the shared option types),
`case` (one case through the replay service), `run` (`run_suite`), `pool` (cases over
worker processes), `results` and `table` (rows, summaries, the text tables), `timeline`
(``--timeline``), `outputs` (results.json, pareto.png), `registry` (`SUITES`), `hazard_jobs`
(carbon-year's jobs for `orchestrator.replay.hazard_bound`: ``heliotrope bench bound``).

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

from orchestrator.replay.suites.base import ORACLE, Suite, SuiteCase, SuiteFactory, SuiteProgress
from orchestrator.replay.suites.carbon_year import CARBON_ORACLE_LEVELS, carbon_year
from orchestrator.replay.suites.case import case_grid, finishing_tick, run_case
from orchestrator.replay.suites.cbl_v100 import cbl_v100
from orchestrator.replay.suites.outputs import write_suite_outputs
from orchestrator.replay.suites.registry import SUITES
from orchestrator.replay.suites.results import PolicySummary, SuiteResult, WindowResult
from orchestrator.replay.suites.run import run_suite
from orchestrator.replay.suites.skynomad_h100 import SKYNOMAD_FILE, skynomad_h100
from orchestrator.replay.suites.timeline import Timeline, suite_timelines

__all__ = [
    "CARBON_ORACLE_LEVELS",
    "ORACLE",
    "SKYNOMAD_FILE",
    "SUITES",
    "PolicySummary",
    "Suite",
    "SuiteCase",
    "SuiteFactory",
    "SuiteProgress",
    "SuiteResult",
    "Timeline",
    "WindowResult",
    "carbon_year",
    "case_grid",
    "cbl_v100",
    "finishing_tick",
    "run_case",
    "run_suite",
    "skynomad_h100",
    "suite_timelines",
    "write_suite_outputs",
]
