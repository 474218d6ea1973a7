"""Report writer for the offline replay.

A replay runs several policies (``on-demand``, ``spot-failover``, ``carbon-greedy``,
``heliotrope``, ``oracle``, ...) over the same jobs and traces.  This module turns the
parsed ``results.json`` plus the stint timeline and the cumulative cost/carbon series into

* ``cost_vs_carbon.png`` -- total USD against location-based kgCO2, one labelled point per
  policy, with the Pareto frontier of the non-reference policies;
* ``gantt.png`` -- one panel per policy, jobs on the y axis, stints coloured by region,
  spot stints hatched and lighter, preemptions and migrations marked;
* ``cumulative_cost.png`` -- cumulative fleet USD (top) and kgCO2 (bottom) over time;
* ``report.html`` -- a self-contained page (inline CSS, no JavaScript, images referenced by
  relative file name) with the config, the per-policy table and the three figures.

:func:`format_table` builds the same per-policy table as a :class:`rich.table.Table` for the
CLI.  Policies named in :data:`REFERENCE_POLICIES` (the clairvoyant ``oracle``) are bounds,
not contenders: they are shown but never highlighted as "best".
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2
import matplotlib

matplotlib.use("Agg")

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from rich.markup import escape as rich_escape
from rich.table import Table

__all__ = [
    "COLUMNS",
    "MAX_GANTT_JOBS",
    "REFERENCE_POLICIES",
    "format_table",
    "write_report",
]

DPI = 110
MAX_GANTT_JOBS = 30
REFERENCE_POLICIES: frozenset[str] = frozenset({"oracle"})
MISSING = "—"
MISSED_COLOUR = "#B3261E"

REPORT_FILE = "report.html"
SCATTER_FILE = "cost_vs_carbon.png"
GANTT_FILE = "gantt.png"
CUMULATIVE_FILE = "cumulative_cost.png"
_TEMPLATES = Path(__file__).with_name("templates")
TEMPLATE = "report.html.j2"

# Okabe & Ito (2008) colour-blind-safe palette, yellow and black last (weak as lines / fills).
OKABE_ITO: tuple[str, ...] = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#D55E00",
    "#CC79A7",
    "#56B4E9",
    "#F0E442",
    "#000000",
)
# Paul Tol's "muted" scheme, to extend the region palette past Okabe-Ito.
TOL_MUTED: tuple[str, ...] = (
    "#332288",
    "#88CCEE",
    "#44AA99",
    "#117733",
    "#999933",
    "#DDCC77",
    "#CC6677",
    "#882255",
    "#AA4499",
    "#DDDDDD",
)
REGION_PALETTE: tuple[str, ...] = OKABE_ITO[:7] + TOL_MUTED
POLICY_MARKERS: tuple[str, ...] = ("o", "s", "D", "^", "v", "P", "X", "<", ">", "h")
POLICY_LINESTYLES: tuple[str, ...] = ("-", "--", "-.", ":")


# --------------------------------------------------------------------------------------------
# Per-policy table
# --------------------------------------------------------------------------------------------

Better = Literal["low", "high"]


@dataclass(frozen=True)
class Column:
    """One metric column of the per-policy table."""

    key: str
    header: str
    kind: Literal["usd", "kg", "share", "int", "hours"]
    better: Better | None


COLUMNS: tuple[Column, ...] = (
    Column("usd", "Cost USD", "usd", "low"),
    Column("objective_usd", "Objective USD", "usd", "low"),
    Column("kg_co2", "kgCO₂ (location)", "kg", "low"),
    Column("kg_co2_marginal", "kgCO₂ (marginal)", "kg", "low"),
    Column("curtailed_energy_share", "Curtailed energy", "share", "high"),
    Column("deadlines_met", "Deadlines met", "int", "high"),
    Column("deadlines_missed", "Deadlines missed", "int", "low"),
    Column("infeasible", "Infeasible", "int", "low"),
    Column("migrations", "Migrations", "int", "low"),
    Column("preemptions", "Preemptions", "int", "low"),
    Column("egress_usd", "Egress USD", "usd", "low"),
    Column("mean_completion_h", "Mean completion h", "hours", "low"),
)

_DECIMALS: dict[str, int] = {"usd": 2, "kg": 2, "share": 1, "int": 0, "hours": 1}
# Shown even when every policy has the same value: what the table is about.
ALWAYS_SHOWN: frozenset[str] = frozenset(
    {"usd", "kg_co2", "deadlines_met", "deadlines_missed", "mean_completion_h"}
)


@dataclass(frozen=True)
class Cell:
    text: str
    best: bool


@dataclass(frozen=True)
class Row:
    policy: str
    reference: bool  # a reference policy (the oracle), shown but never ranked
    cells: tuple[Cell, ...]
    missed: int = 0  # deadlines it missed: marked everywhere, never ranked
    bound: bool = False  # a reference that is a bound here (nothing met the deadlines cheaper)

    @property
    def label(self) -> str:
        """The policy's name with what the reader must know about it."""
        text = self.policy
        if self.reference:
            text += " (bound)" if self.bound else " (reference, not a bound)"
        if self.missed:
            text += f" — missed {self.missed}"
        return text


def _as_float(value: Any) -> float | None:
    """A finite float, or ``None`` for missing / non-numeric / NaN / inf values."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _display_value(value: float, kind: str) -> float:
    """The value as shown (shares in percent), rounded to the displayed precision."""
    shown = value * 100.0 if kind == "share" else value
    return round(shown, _DECIMALS[kind])


def _format_value(value: float | None, kind: str) -> str:
    if value is None:
        return MISSING
    shown = _display_value(value, kind)
    if kind == "int":
        return f"{int(shown):,d}"
    if kind == "share":
        return f"{shown:.1f}%"
    if kind == "hours":
        return f"{shown:,.1f}"
    return f"{shown:,.2f}"


def _policies(results: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    raw = results.get("policies") or {}
    out: dict[str, Mapping[str, Any]] = {}
    for name, metrics in raw.items():
        out[str(name)] = metrics if isinstance(metrics, Mapping) else {}
    return out


def _missed(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Policies that missed deadlines (of the feasible jobs), and how many."""
    out = {}
    for name, metrics in policies.items():
        missed = _as_float(metrics.get("deadlines_missed"))
        if missed is not None and missed > 0:
            out[name] = int(missed)
    return out


def _objective(metrics: Mapping[str, Any]) -> float | None:
    value = _as_float(metrics.get("objective_usd"))
    return value if value is not None else _as_float(metrics.get("usd"))


def _beaten_by(results: Mapping[str, Any], reference: str) -> list[str]:
    """The policies that met every deadline at a lower objective than `reference`: where
    there are any, the reference is no bound (e.g. the oracle's hindsight model differs
    from the replay's)."""
    policies = _policies(results)
    missed = _missed(policies)
    ref = _objective(policies.get(reference, {}))
    if ref is None:
        return []
    tol = 1e-6 * max(1.0, abs(ref))
    return [
        n
        for n, m in policies.items()
        if n != reference and n not in missed and (v := _objective(m)) is not None and v < ref - tol
    ]


def _contenders(results: Mapping[str, Any]) -> list[str]:
    """Who may be ranked: not a reference, no missed deadline. With only references, the
    references (a lone oracle still has its numbers, just nothing to beat)."""
    policies = _policies(results)
    missed = _missed(policies)
    names = [n for n in policies if n not in REFERENCE_POLICIES]
    if not names:
        return [n for n in policies if n not in missed]
    return [n for n in names if n not in missed]


def _shown_columns(results: Mapping[str, Any]) -> tuple[tuple[Column, ...], list[str]]:
    """The columns worth a place on a laptop screen, and a note for each one left out
    because every policy shows the same value (``Curtailed energy 0.0%``)."""
    policies = _policies(results)
    keep, dropped = [], []
    for col in COLUMNS:
        texts = {_format_value(_as_float(m.get(col.key)), col.kind) for m in policies.values()}
        if col.key not in ALWAYS_SHOWN and len(policies) > 1 and len(texts) == 1:
            dropped.append(f"{col.header} {texts.pop()}")
            continue
        keep.append(col)
    return tuple(keep), dropped


def _rows(results: Mapping[str, Any], columns: Sequence[Column] | None = None) -> list[Row]:
    """Formatted rows with the best value(s) per column flagged.

    Best is judged on the displayed (rounded) value so visual ties are all highlighted,
    among the contenders only (no reference, no policy that missed a deadline), and only
    when the column is not constant.
    """
    columns = COLUMNS if columns is None else columns
    policies = _policies(results)
    names = list(policies)
    missed = _missed(policies)
    contenders = _contenders(results)
    # A reference is one only beside something to compare with (a lone oracle is a policy).
    others = [n for n in names if n not in REFERENCE_POLICIES]
    references = {n for n in names if n in REFERENCE_POLICIES} if others else set()
    best: dict[str, set[str]] = {}
    for col in columns:
        shown = {
            n: _display_value(v, col.kind)
            for n in contenders
            if (v := _as_float(policies[n].get(col.key))) is not None
        }
        if col.better is None or len(shown) < 2 or len(set(shown.values())) < 2:
            best[col.key] = set()
            continue
        target = min(shown.values()) if col.better == "low" else max(shown.values())
        best[col.key] = {n for n, v in shown.items() if v == target}
    rows: list[Row] = []
    for name in names:
        metrics = policies[name]
        cells = tuple(
            Cell(
                _format_value(_as_float(metrics.get(col.key)), col.kind),
                name in best[col.key],
            )
            for col in columns
        )
        reference = name in references
        rows.append(
            Row(
                name,
                reference,
                cells,
                missed=missed.get(name, 0),
                bound=reference and name not in missed and not _beaten_by(results, name),
            )
        )
    return rows


# Terminal headers: the HTML report has room for the long ones.
SHORT_HEADERS: Mapping[str, str] = {
    "usd": "USD",
    "objective_usd": "Obj. USD",
    "kg_co2": "kgCO₂",
    "kg_co2_marginal": "kgCO₂ marg.",
    "curtailed_energy_share": "Curt.",
    "deadlines_met": "Met",
    "deadlines_missed": "Missed",
    "infeasible": "Infeas.",
    "migrations": "Moves",
    "preemptions": "Preempt.",
    "egress_usd": "Egress $",
    "mean_completion_h": "Mean h",
}


def format_table(results: Mapping[str, Any]) -> Table:
    """The per-policy results table for the terminal: best values in bold green (among
    policies that met every deadline), a policy that missed deadlines in red and said so,
    the oracle called a bound only where it is one; columns equal for every policy are left
    out and named in the caption."""
    columns, dropped = _shown_columns(results)
    table = Table(
        title="Replay results",
        title_justify="left",
        header_style="bold",
        caption=_rich_escape("Same for every policy: " + "; ".join(dropped)) if dropped else None,
        caption_justify="left",
    )
    table.add_column("Policy", no_wrap=True)
    for col in columns:
        table.add_column(SHORT_HEADERS.get(col.key, col.header), justify="right")
    for row in _rows(results, columns):
        cells = [
            f"[bold green]{_rich_escape(c.text)}[/]" if c.best else _rich_escape(c.text)
            for c in row.cells
        ]
        name = _rich_escape(row.label)
        if row.missed:
            name = f"[red]{name}[/]"
        table.add_row(name, *cells, style="dim italic" if row.reference else None)
    return table


def _rich_escape(text: str) -> str:
    return rich_escape(text)


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _config_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def _pct(value: float, baseline: float) -> float:
    return 100.0 * (baseline - value) / baseline if baseline else 0.0


def _compare(
    name: str, ours: Mapping[str, Any], other: str, theirs: Mapping[str, Any], note: str = ""
) -> str | None:
    """``18% cheaper than spot-failover, 53% less CO₂`` (or dearer / more), from totals."""
    usd, kg = _as_float(ours.get("usd")), _as_float(ours.get("kg_co2"))
    base_usd, base_kg = _as_float(theirs.get("usd")), _as_float(theirs.get("kg_co2"))
    if usd is None or base_usd is None or base_usd <= 0:
        return None
    d = _pct(usd, base_usd)
    text = (
        f"{abs(d):.0f}% {'cheaper' if d >= 0 else 'dearer'} than {other}"
        if round(d)
        else f"as cheap as {other}"
    ) + note
    if kg is not None and base_kg is not None and base_kg > 0:
        c = _pct(kg, base_kg)
        text += (
            f", {abs(c):.0f}% {'less' if c >= 0 else 'more'} CO₂" if round(c) else ", the same CO₂"
        )
    return text


def summary(results: Mapping[str, Any], focus: str = "heliotrope") -> str:
    """One paragraph in words: how `focus` (else the cheapest policy that met every
    deadline) did against the cheapest other policy that met every deadline and against
    on-demand, its deadlines, who missed deadlines, and whether the oracle is a bound."""
    policies = _policies(results)
    if not policies:
        return ""
    missed = _missed(policies)
    contenders = [n for n in _contenders(results) if n not in REFERENCE_POLICIES]
    by_cost = sorted(contenders, key=lambda n: _as_float(policies[n].get("usd")) or math.inf)
    if focus not in policies or focus in REFERENCE_POLICIES:
        focus = by_cost[0] if by_cost else next(iter(policies))
    ours = policies[focus]
    met = int(_as_float(ours.get("deadlines_met")) or 0)
    infeasible = int(_as_float(ours.get("infeasible")) or 0)
    if focus in missed:
        deadlines = f"it missed {missed[focus]} of {met + missed[focus]} deadlines"
    else:
        deadlines = f"all {met} deadline{'s' if met != 1 else ''} met"
    if infeasible:
        deadlines += (
            f" ({infeasible} job{'s' if infeasible != 1 else ''} no policy could "
            "finish in time left out)"
        )
    others = [n for n in by_cost if n != focus]
    parts = []
    if others:
        versus = _compare(
            focus,
            ours,
            others[0],
            policies[others[0]],
            " (the cheapest other policy that met every deadline)" if len(others) > 1 else "",
        )
        if versus:
            parts.append(versus)
    if "on-demand" in policies and "on-demand" not in (focus, *others[:1]):
        versus = _compare(focus, ours, "on-demand", policies["on-demand"])
        if versus:
            parts.append(versus)
    text = f"{focus}: " + ("; ".join(parts) + "; " if parts else "") + deadlines + "."
    if focus in missed:
        text += " Its cost is not comparable with policies that met every deadline."
    losers = [n for n in policies if n in missed and n != focus]
    if losers:
        text += (
            " "
            + ", ".join(f"{n} missed {missed[n]}" for n in losers)
            + " deadline(s): marked in the table and the plot and never ranked best."
        )
    for ref in (n for n in policies if n in REFERENCE_POLICIES and n != focus):
        beaten = _beaten_by(results, ref)
        if beaten:
            text += (
                f" The {ref} (hindsight) is shown for reference but is not a bound here: "
                f"{', '.join(beaten)} met every deadline at a lower objective."
            )
        elif ref not in missed and _objective(policies[ref]) is not None:
            gap = _objective(ours)
            bound = _objective(policies[ref])
            if gap is not None and bound:
                text += (
                    f" The {ref} (hindsight, a bound on the objective): "
                    f"{abs(_pct(bound, gap)):.0f}% below {focus}'s objective."
                )
    return text


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def _missed_note(missed: Mapping[str, int], name: str) -> str:
    n = missed.get(name, 0)
    return f" — missed {n} deadline{'s' if n != 1 else ''}" if n else ""


def _mpl_text(text: str) -> str:
    """Escape ``$`` so matplotlib does not parse user strings as mathtext."""
    return text.replace("$", r"\$")


def _policy_styles(names: Sequence[str]) -> dict[str, tuple[str, str, str]]:
    """Colour, marker and line style per policy, stable across the three figures."""
    styles: dict[str, tuple[str, str, str]] = {}
    for i, name in enumerate(names):
        styles[name] = (
            OKABE_ITO[i % len(OKABE_ITO)],
            POLICY_MARKERS[i % len(POLICY_MARKERS)],
            POLICY_LINESTYLES[(i // len(OKABE_ITO)) % len(POLICY_LINESTYLES)],
        )
    return styles


def _save(fig: Figure, path: Path) -> None:
    try:
        fig.savefig(path, dpi=DPI, facecolor="white")
    finally:
        plt.close(fig)


def _empty_figure(path: Path, title: str, message: str, size: tuple[float, float]) -> None:
    fig, ax = plt.subplots(figsize=size, layout="constrained")
    ax.set_axis_off()
    ax.set_title(_mpl_text(title))
    ax.text(0.5, 0.5, _mpl_text(message), ha="center", va="center", fontsize=12, color="#555")
    _save(fig, path)


def _pareto(points: Iterable[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Non-dominated points (minimising both coordinates), sorted by x."""
    frontier: list[tuple[str, float, float]] = []
    best_y = math.inf
    for name, x, y in sorted(points, key=lambda p: (p[1], p[2])):
        if y < best_y:
            frontier.append((name, x, y))
            best_y = y
    return frontier


_LABEL_OFFSETS: tuple[tuple[float, float], ...] = (
    (7, 7),
    (7, -13),
    (-7, 7),
    (-7, -13),
    (7, 19),
    (7, -25),
)


def _plot_cost_vs_carbon(
    results: Mapping[str, Any], styles: Mapping[str, tuple[str, str, str]], path: Path
) -> None:
    policies = _policies(results)
    points: list[tuple[str, float, float]] = []
    for name, metrics in policies.items():
        usd = _as_float(metrics.get("usd"))
        kg = _as_float(metrics.get("kg_co2"))
        if usd is not None and kg is not None:
            points.append((name, usd, kg))
    title = "Cost vs. carbon per policy"
    if not points:
        _empty_figure(path, title, "no policy has both a cost and an emissions total", (8, 6))
        return

    fig, ax = plt.subplots(figsize=(8, 6), layout="constrained")
    missed = _missed(policies)
    ranked = set(_contenders(results))
    contenders = [p for p in points if p[0] not in REFERENCE_POLICIES] or points
    frontier = _pareto([p for p in points if p[0] in ranked and p[0] not in REFERENCE_POLICIES])
    if len(frontier) >= 2:
        ax.plot(
            [p[1] for p in frontier],
            [p[2] for p in frontier],
            drawstyle="steps-post",
            color="#888888",
            linestyle="--",
            linewidth=1.2,
            zorder=1,
            label="Pareto frontier",
        )
    for name, usd, kg in points:
        colour, marker, _ = styles[name]
        reference = name in REFERENCE_POLICIES and len(contenders) < len(points)
        late = name in missed
        ax.scatter(
            [usd],
            [kg],
            s=140 if reference else 80,
            marker="*" if reference else marker,
            color="none" if late else colour,
            edgecolors=MISSED_COLOUR if late else "black",
            linewidths=1.8 if late else 0.7,
            zorder=3,
        )

    xs = np.array([p[1] for p in points])
    ys = np.array([p[2] for p in points])
    x_span = float(xs.max() - xs.min()) or max(abs(float(xs.max())), 1.0)
    y_span = float(ys.max() - ys.min()) or max(abs(float(ys.max())), 1.0)
    placed: list[tuple[float, float, int]] = []
    for name, usd, kg in points:
        nx, ny = (usd - float(xs.min())) / x_span, (kg - float(ys.min())) / y_span
        crowded = {i for (px, py, i) in placed if abs(px - nx) < 0.12 and abs(py - ny) < 0.06}
        slot = next((i for i in range(len(_LABEL_OFFSETS)) if i not in crowded), 0)
        placed.append((nx, ny, slot))
        dx, dy = _LABEL_OFFSETS[slot]
        label = name
        if name in REFERENCE_POLICIES and len(contenders) < len(points):
            label += " (reference)" if _beaten_by(results, name) or name in missed else " (bound)"
        if name in missed:
            label += f"\nmissed {missed[name]} deadline{'s' if missed[name] != 1 else ''}"
        ax.annotate(
            _mpl_text(label),
            (usd, kg),
            xytext=(dx, dy),
            textcoords="offset points",
            ha="left" if dx > 0 else "right",
            color=MISSED_COLOUR if name in missed else "black",
            fontsize=9,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.75},
            zorder=4,
        )
    ax.margins(x=0.18, y=0.15)
    ax.set_xlabel("total cost (USD)")
    ax.set_ylabel("emissions (kg CO₂, location-based)")
    ax.set_title(
        title
        + (
            " (lower-left is better; hollow red: missed deadlines, not comparable)"
            if missed
            else " (lower-left is better)"
        ),
        fontsize=10 if missed else None,
    )
    ax.grid(True, color="#e5e5e5", linewidth=0.8)
    ax.set_axisbelow(True)
    if len(frontier) >= 2:
        ax.legend(loc="upper right", fontsize=8, frameon=False)
    _save(fig, path)


_TIMELINE_COLUMNS = ("policy", "job", "start", "end")


def _naive_utc(values: pd.Series) -> pd.Series:
    converted = pd.to_datetime(values, utc=True)
    return converted.dt.tz_convert(None)


def _prepare_timeline(timeline: pd.DataFrame) -> pd.DataFrame:
    if timeline is None or timeline.empty or not set(_TIMELINE_COLUMNS) <= set(timeline.columns):
        return pd.DataFrame(
            columns=["policy", "job", "start", "end", "region_label", "market", "end_reason"]
        )
    df = timeline.copy()
    df["policy"] = df["policy"].astype(str)
    df["job"] = df["job"].astype(str)
    df["start"] = _naive_utc(df["start"])
    df["end"] = _naive_utc(df["end"])
    df = df.dropna(subset=["start", "end"])
    region = (
        df["region"].fillna("").astype(str)
        if "region" in df.columns
        else pd.Series("", index=df.index)
    )
    if "cloud" in df.columns:
        cloud = df["cloud"].fillna("").astype(str)
        label = cloud.where(cloud == "", cloud + "/") + region
    else:
        label = region
    df["region_label"] = label.where(label != "", "unknown")
    df["market"] = df["market"].fillna("").astype(str) if "market" in df.columns else "on_demand"
    df["end_reason"] = df["end_reason"].fillna("").astype(str) if "end_reason" in df.columns else ""
    return df


def _natural_key(text: str) -> tuple[tuple[int, int | str], ...]:
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", text) if part
    )


def _date_nums(values: pd.Series) -> np.ndarray[Any, np.dtype[np.float64]]:
    nums = mdates.date2num(values.to_numpy())  # type: ignore[no-untyped-call]
    return np.asarray(nums, dtype=np.float64)


def _format_time_axis(ax: Axes) -> None:
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    formatter = mdates.ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(formatter)


def _plot_gantt(results: Mapping[str, Any], timeline: pd.DataFrame, path: Path) -> tuple[int, int]:
    """Draw the Gantt chart; returns (jobs shown, jobs total)."""
    df = _prepare_timeline(timeline)
    if df.empty:
        _empty_figure(path, "Job stints per policy", "no stints in the timeline", (10, 3))
        return 0, 0

    names = list(_policies(results))
    names += sorted(set(df["policy"]) - set(names), key=_natural_key)
    all_jobs = sorted(set(df["job"]), key=_natural_key)
    jobs = all_jobs[:MAX_GANTT_JOBS]
    job_y = {job: i for i, job in enumerate(jobs)}
    df = df[df["job"].isin(job_y)]
    regions = sorted(set(df["region_label"]), key=_natural_key)
    region_colour = {r: REGION_PALETTE[i % len(REGION_PALETTE)] for i, r in enumerate(regions)}

    lane_in = 0.17 if len(jobs) > 10 else 0.24
    panel_h = [0.65 + lane_in * len(jobs) for _ in names]
    fig_h = sum(panel_h) + 1.0
    fig, axes_arr = plt.subplots(
        len(names),
        1,
        figsize=(11, fig_h),
        sharex=True,
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": panel_h},
    )
    axes: list[Axes] = [a for a in axes_arr[:, 0]]
    fontsize = 7 if len(jobs) > 15 else 8
    t0 = float(_date_nums(df["start"]).min())
    t1 = float(_date_nums(df["end"]).max())
    if t1 <= t0:
        t1 = t0 + 1.0 / 24.0

    missed = _missed(_policies(results))
    for ax, name in zip(axes, names, strict=True):
        sub = df[df["policy"] == name]
        ax.set_title(
            _mpl_text(name + _missed_note(missed, name)),
            loc="left",
            fontsize=9,
            fontweight="bold",
            color=MISSED_COLOUR if name in missed else "black",
        )
        ax.set_yticks(range(len(jobs)))
        ax.set_yticklabels([_mpl_text(j[:28]) for j in jobs], fontsize=fontsize)
        ax.set_ylim(len(jobs) - 0.5, -0.5)
        ax.grid(True, axis="x", color="#e5e5e5", linewidth=0.8)
        ax.set_axisbelow(True)
        if sub.empty:
            ax.text(
                0.5,
                0.5,
                "no stints",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#777",
                fontsize=9,
            )
            continue
        starts = _date_nums(sub["start"])
        ends = _date_nums(sub["end"])
        widths = np.maximum(ends - starts, (t1 - t0) * 1e-3)
        ys = np.array([job_y[j] for j in sub["job"]], dtype=np.float64)
        colours = [region_colour[r] for r in sub["region_label"]]
        spot = (sub["market"] == "spot").to_numpy()
        for mask, hatch, alpha in ((~spot, None, 0.95), (spot, "////", 0.55)):
            if not mask.any():
                continue
            ax.barh(
                ys[mask],
                widths[mask],
                left=starts[mask],
                height=0.7,
                color=[c for c, m in zip(colours, mask, strict=True) if m],
                alpha=alpha,
                hatch=hatch,
                edgecolor="#333333",
                linewidth=0.4,
            )
        reasons = sub["end_reason"].to_numpy()
        for reason, marker, colour, size in (
            ("preempted", "X", "black", 42),
            ("migrated", ">", "#444444", 40),
        ):
            hit = reasons == reason
            if hit.any():
                ax.scatter(
                    ends[hit],
                    ys[hit],
                    marker=marker,
                    s=size,
                    color=colour,
                    edgecolors="white",
                    linewidths=0.5,
                    zorder=4,
                )

    axes[-1].set_xlim(t0 - (t1 - t0) * 0.01, t1 + (t1 - t0) * 0.01)
    _format_time_axis(axes[-1])
    axes[-1].set_xlabel("time (UTC)")

    handles: list[Patch | Line2D] = [
        Patch(facecolor=region_colour[r], edgecolor="#333333", label=_mpl_text(r)) for r in regions
    ]
    handles += [
        Patch(facecolor="#bbbbbb", edgecolor="#333333", label="on-demand"),
        Patch(facecolor="#bbbbbb", edgecolor="#333333", hatch="////", alpha=0.55, label="spot"),
        Line2D(
            [], [], marker="X", color="black", linestyle="none", markersize=7, label="preempted"
        ),
        Line2D(
            [], [], marker=">", color="#444444", linestyle="none", markersize=7, label="migrated"
        ),
    ]
    fig.legend(
        handles=handles,
        loc="outside right upper",
        fontsize=8,
        frameon=False,
        title="region / market",
        title_fontsize=8,
    )
    title = "Job stints per policy"
    if len(all_jobs) > len(jobs):
        title += f" (showing the first {len(jobs)} of {len(all_jobs)} jobs)"
    fig.suptitle(title, fontsize=11)
    _save(fig, path)
    return len(jobs), len(all_jobs)


def _plot_cumulative(
    results: Mapping[str, Any],
    cumulative: pd.DataFrame,
    styles: Mapping[str, tuple[str, str, str]],
    path: Path,
) -> None:
    title = "Cumulative fleet cost and emissions"
    needed = {"policy", "time"}
    if cumulative is None or cumulative.empty or not needed <= set(cumulative.columns):
        _empty_figure(path, title, "no cumulative series", (10, 3))
        return
    df = cumulative.copy()
    df["policy"] = df["policy"].astype(str)
    df["time"] = _naive_utc(df["time"])
    df = df.dropna(subset=["time"]).sort_values(["policy", "time"], kind="stable")
    names = [n for n in _policies(results) if n in set(df["policy"])]
    names += sorted(set(df["policy"]) - set(names), key=_natural_key)
    all_styles = dict(styles)
    extra = _policy_styles(list(styles) + [n for n in names if n not in styles])
    for n in names:
        all_styles.setdefault(n, extra[n])

    missed = _missed(_policies(results))
    fig, axes_arr = plt.subplots(
        2, 1, figsize=(10, 7), sharex=True, squeeze=False, layout="constrained"
    )
    ax_usd: Axes = axes_arr[0, 0]
    ax_kg: Axes = axes_arr[1, 0]
    panels: tuple[tuple[Axes, str, str], ...] = (
        (ax_usd, "usd", "cumulative cost (USD)"),
        (ax_kg, "kg_co2", "cumulative emissions (kg CO₂)"),
    )
    for ax, column, label in panels:
        if column not in df.columns:
            ax.text(
                0.5,
                0.5,
                f"no {column} column",
                transform=ax.transAxes,
                ha="center",
                va="center",
                color="#777",
            )
        else:
            for name in names:
                sub = df[df["policy"] == name]
                values = pd.to_numeric(sub[column], errors="coerce").to_numpy(dtype=np.float64)
                colour, _, linestyle = all_styles[name]
                ax.plot(
                    _date_nums(sub["time"]),
                    values,
                    drawstyle="steps-post",
                    color=colour,
                    linestyle=linestyle,
                    linewidth=2.2 if name == "heliotrope" else 1.5,
                    label=_mpl_text(name + _missed_note(missed, name)),
                )
        ax.set_ylabel(label)
        ax.grid(True, color="#e5e5e5", linewidth=0.8)
        ax.set_axisbelow(True)
    if names and "usd" in df.columns:
        fig.legend(
            *ax_usd.get_legend_handles_labels(),
            loc="outside right upper",
            fontsize=8,
            frameon=False,
        )
    _format_time_axis(ax_kg)
    ax_kg.set_xlabel("time (UTC)")
    fig.suptitle(title, fontsize=11)
    _save(fig, path)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


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
    styles = _policy_styles(list(_policies(results)))

    _plot_cost_vs_carbon(results, styles, out_dir / SCATTER_FILE)
    shown, total = _plot_gantt(results, timeline, out_dir / GANTT_FILE)
    _plot_cumulative(results, cumulative, styles, out_dir / CUMULATIVE_FILE)

    gantt_caption = (
        "Stints of each job on each policy, coloured by cloud/region. Solid bars are "
        "on-demand, hatched lighter bars spot; a cross marks a preemption, a triangle a "
        "migration."
    )
    if total == 0:
        gantt_caption = "No stints were recorded in this replay."
    elif shown < total:
        gantt_caption += f" Only the first {shown} of {total} jobs are shown."
    figures = [
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
    columns, dropped = _shown_columns(results)
    table_note = (
        "Best value per column highlighted (ties included) among policies that met every "
        "deadline; a policy that missed deadlines is marked red and never ranked; reference "
        "policies (the oracle) are not ranked and are called a bound only where no policy "
        "met every deadline at a lower objective. kgCO₂ (location) uses average grid "
        "intensity, kgCO₂ (marginal) marginal emissions rates; curtailed energy is the "
        "share of energy drawn while the grid was curtailing renewables. "
        f"{MISSING} means not available. Hover a header for its full name."
    )
    if dropped:
        table_note += " Same for every policy, so left out: " + "; ".join(dropped) + "."
    rows = []
    for row in _rows(results, columns):
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
            rows=rows,
            table_note=table_note,
            figures=figures,
            config=[(str(k), _config_value(v)) for k, v in config.items()],
        )
    )
    report = out_dir / REPORT_FILE
    report.write_text(page, encoding="utf-8")
    return report
