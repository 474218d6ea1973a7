"""Report writer for the offline replay.

A replay runs several policies (``on-demand``, ``spot-failover``, ``carbon-greedy``,
``heliotrope``, ``oracle``, ...) over the same jobs and traces. This package turns the
parsed ``results.json`` plus the stint timeline and the cumulative cost/carbon series into

* ``cost_vs_carbon.png`` -- total USD against location-based kgCO2, one labelled point per
  policy, with the Pareto frontier of the non-reference policies;
* ``gantt.png`` -- one panel per policy, jobs on the y axis, stints coloured by region,
  spot stints hatched and lighter, preemptions and migrations marked;
* ``cumulative_cost.png`` -- cumulative fleet USD (top) and kgCO2 (bottom) over time;
* ``report.html`` -- a self-contained page with the config, the per-policy table and the
  three figures.

`table` (the per-policy table, `format_table` for the terminal), `summary` (the paragraph in
words), `plots` (the figures), `html` (`write_report`: the jinja2 template
``orchestrator/replay/templates/report.html.j2``).
"""

from __future__ import annotations

from orchestrator.replay.report.html import write_report
from orchestrator.replay.report.plots import MAX_GANTT_JOBS
from orchestrator.replay.report.summary import summary
from orchestrator.replay.report.table import COLUMNS, REFERENCE_POLICIES, format_table

__all__ = [
    "COLUMNS",
    "MAX_GANTT_JOBS",
    "REFERENCE_POLICIES",
    "format_table",
    "summary",
    "write_report",
]
