"""``report.html``: the figures, the per-policy table and the config on one self-contained
page (inline CSS, no JavaScript, images by relative file name), from the jinja2 template
``orchestrator/replay/templates/report.html.j2`` (autoescaped)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from orchestrator.replay.report.plots import (
    plot_cost_vs_carbon,
    plot_cumulative,
    plot_gantt,
    policy_styles,
)
from orchestrator.replay.report.summary import summary
from orchestrator.replay.report.table import (
    MISSING,
    SHORT_HEADERS,
    Column,
    policy_metrics,
    shown_columns,
    table_rows,
)

REPORT_FILE = "report.html"
SCATTER_FILE = "cost_vs_carbon.png"
GANTT_FILE = "gantt.png"
CUMULATIVE_FILE = "cumulative_cost.png"
_TEMPLATES = Path(__file__).parent.parent / "templates"
TEMPLATE = "report.html.j2"


def _config_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def _subtitle(config: Mapping[str, Any]) -> str:
    parts: list[str] = []
    if "start" in config or "end" in config:
        parts.append(f"{config.get('start', '?')} → {config.get('end', '?')} (UTC)")
    for key, label in (("jobs", "jobs"), ("traces", "traces")):
        if key in config:
            parts.append(f"{label}: {_config_value(config[key])}")
    return " · ".join(parts) or "Offline replay of recorded price, carbon and capacity traces."


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def write_report(
    results: Mapping[str, Any],
    timeline: pd.DataFrame,
    cumulative: pd.DataFrame,
    out_dir: Path,
) -> Path:
    """Write the three figures and ``report.html`` into ``out_dir``; return the HTML path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_raw = results.get("config") or {}
    config: Mapping[str, Any] = config_raw if isinstance(config_raw, Mapping) else {}
    styles = policy_styles(list(policy_metrics(results)))

    plot_cost_vs_carbon(results, styles, out_dir / SCATTER_FILE)
    shown, total = plot_gantt(results, timeline, out_dir / GANTT_FILE)
    plot_cumulative(results, cumulative, styles, out_dir / CUMULATIVE_FILE)

    columns, dropped = shown_columns(results)
    page = (
        _environment()
        .get_template(TEMPLATE)
        .render(
            title="Heliotrope replay report",
            subtitle=_subtitle(config),
            summary=summary(results),
            columns=[
                {"header": c.header, "short": SHORT_HEADERS.get(c.key, c.header)} for c in columns
            ],
            rows=_html_rows(results, columns),
            table_note=_table_note(dropped),
            figures=_figures(shown, total),
            config=[(str(k), _config_value(v)) for k, v in config.items()],
        )
    )
    report = out_dir / REPORT_FILE
    report.write_text(page, encoding="utf-8")
    return report


def _figures(shown: int, total: int) -> list[dict[str, str]]:
    """The three figures with their alt text and captions (`shown` of `total` jobs in the
    Gantt chart)."""
    gantt_caption = (
        "Stints of each job on each policy, coloured by cloud/region. Solid bars are "
        "on-demand, hatched lighter bars spot; a cross marks a preemption, a triangle a "
        "migration."
    )
    if total == 0:
        gantt_caption = "No stints were recorded in this replay."
    elif shown < total:
        gantt_caption += f" Only the first {shown} of {total} jobs are shown."
    return [
        {
            "file": SCATTER_FILE,
            "alt": "Scatter of total cost against emissions per policy",
            "caption": "Total cost (USD) against location-based emissions (kgCO₂), one point per "
            "policy; lower-left is better among policies that met every deadline. "
            "Hollow red markers missed deadlines: they are not comparable and are "
            "left out of the dashed Pareto line, as are reference policies such as "
            "the oracle.",
        },
        {
            "file": GANTT_FILE,
            "alt": "Gantt chart of job stints per policy",
            "caption": gantt_caption,
        },
        {
            "file": CUMULATIVE_FILE,
            "alt": "Cumulative cost and emissions over time per policy",
            "caption": "Cumulative fleet cost (top) and location-based emissions (bottom) over "
            "the replay window, per policy.",
        },
    ]


def _table_note(dropped: Sequence[str]) -> str:
    note = (
        "Best value per column highlighted (ties included) among policies that met every "
        "deadline; a policy that missed deadlines is marked red and never ranked; reference "
        "policies (the oracle) are not ranked and are called a bound only where no policy "
        "met every deadline at a lower objective. kgCO₂ (location) uses average grid "
        "intensity, kgCO₂ (marginal) marginal emissions rates; curtailed energy is the "
        "share of energy drawn while the grid was curtailing renewables. "
        f"{MISSING} means not available. Hover a header for its full name."
    )
    if dropped:
        note += " Same for every policy, so left out: " + "; ".join(dropped) + "."
    return note


def _html_rows(results: Mapping[str, Any], columns: Sequence[Column]) -> list[dict[str, Any]]:
    rows = []
    for row in table_rows(results, columns):
        name = row.policy
        if row.reference:
            name += " (bound)" if row.bound else " (reference, not a bound)"
        classes = " ".join(
            c for c, on in (("reference", row.reference), ("missed", bool(row.missed))) if on
        )
        rows.append(
            {
                "name": name,
                "classes": classes,
                "cells": row.cells,
                "flag": f"✗ missed {row.missed}" if row.missed else "",
            }
        )
    return rows
