"""The replay's three figures: cost against carbon per policy (with the Pareto frontier of
the contenders), the stints of each job per policy (a Gantt chart), and the cumulative cost
and emissions over time. Colour-blind-safe palettes; a policy that missed deadlines is drawn
hollow red and labelled."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

from orchestrator.replay.report.table import (
    REFERENCE_POLICIES,
    as_float,
    beaten_by,
    missed_deadlines,
    policy_metrics,
    ranked_policies,
)

DPI = 110
MAX_GANTT_JOBS = 30
MISSED_COLOUR = "#B3261E"


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


def _missed_note(missed: Mapping[str, int], name: str) -> str:
    n = missed.get(name, 0)
    return f" — missed {n} deadline{'s' if n != 1 else ''}" if n else ""


def _mpl_text(text: str) -> str:
    """Escape ``$`` so matplotlib does not parse user strings as mathtext."""
    return text.replace("$", r"\$")


def policy_styles(names: Sequence[str]) -> dict[str, tuple[str, str, str]]:
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


def plot_cost_vs_carbon(
    results: Mapping[str, Any], styles: Mapping[str, tuple[str, str, str]], path: Path
) -> None:
    policies = policy_metrics(results)
    points: list[tuple[str, float, float]] = []
    for name, metrics in policies.items():
        usd = as_float(metrics.get("usd"))
        kg = as_float(metrics.get("kg_co2"))
        if usd is not None and kg is not None:
            points.append((name, usd, kg))
    title = "Cost vs. carbon per policy"
    if not points:
        _empty_figure(path, title, "no policy has both a cost and an emissions total", (8, 6))
        return

    fig, ax = plt.subplots(figsize=(8, 6), layout="constrained")
    missed = missed_deadlines(policies)
    ranked = set(ranked_policies(results))
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

    _label_points(ax, results, points, missed, len(contenders) < len(points))
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


def _label_points(
    ax: Axes,
    results: Mapping[str, Any],
    points: Sequence[tuple[str, float, float]],
    missed: Mapping[str, int],
    references_shown: bool,
) -> None:
    """Each point's name beside it, in the first offset no nearby label took; a reference
    called a bound or not, a late policy's misses said."""
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
        if name in REFERENCE_POLICIES and references_shown:
            label += " (reference)" if beaten_by(results, name) or name in missed else " (bound)"
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


def plot_gantt(results: Mapping[str, Any], timeline: pd.DataFrame, path: Path) -> tuple[int, int]:
    """Draw the Gantt chart; returns (jobs shown, jobs total)."""
    df = _prepare_timeline(timeline)
    if df.empty:
        _empty_figure(path, "Job stints per policy", "no stints in the timeline", (10, 3))
        return 0, 0

    names = list(policy_metrics(results))
    names += sorted(set(df["policy"]) - set(names), key=_natural_key)
    all_jobs = sorted(set(df["job"]), key=_natural_key)
    jobs = all_jobs[:MAX_GANTT_JOBS]
    df = df[df["job"].isin(jobs)]
    regions = sorted(set(df["region_label"]), key=_natural_key)
    lanes = _Lanes(
        jobs=jobs,
        y={job: i for i, job in enumerate(jobs)},
        region_colour={r: REGION_PALETTE[i % len(REGION_PALETTE)] for i, r in enumerate(regions)},
        t0=float(_date_nums(df["start"]).min()),
        t1=float(_date_nums(df["end"]).max()),
    )
    lane_in = 0.17 if len(jobs) > 10 else 0.24
    panel_h = [0.65 + lane_in * len(jobs) for _ in names]
    fig, axes_arr = plt.subplots(
        len(names),
        1,
        figsize=(11, sum(panel_h) + 1.0),
        sharex=True,
        squeeze=False,
        layout="constrained",
        gridspec_kw={"height_ratios": panel_h},
    )
    axes: list[Axes] = [a for a in axes_arr[:, 0]]
    missed = missed_deadlines(policy_metrics(results))
    for ax, name in zip(axes, names, strict=True):
        _gantt_panel(ax, df[df["policy"] == name], name, missed, lanes)

    t0, t1 = lanes.t0, lanes.t1
    axes[-1].set_xlim(t0 - (t1 - t0) * 0.01, t1 + (t1 - t0) * 0.01)
    _format_time_axis(axes[-1])
    axes[-1].set_xlabel("time (UTC)")
    _gantt_legend(fig, regions, lanes.region_colour)
    title = "Job stints per policy"
    if len(all_jobs) > len(jobs):
        title += f" (showing the first {len(jobs)} of {len(all_jobs)} jobs)"
    fig.suptitle(title, fontsize=11)
    _save(fig, path)
    return len(jobs), len(all_jobs)


@dataclass(frozen=True)
class _Lanes:
    """What every Gantt panel shares: the jobs shown (one lane each), region colours and
    the time span (matplotlib date numbers)."""

    jobs: list[str]
    y: Mapping[str, int]
    region_colour: Mapping[str, str]
    t0: float
    t1: float

    def __post_init__(self) -> None:
        if self.t1 <= self.t0:
            object.__setattr__(self, "t1", self.t0 + 1.0 / 24.0)


def _gantt_panel(
    ax: Axes, sub: pd.DataFrame, name: str, missed: Mapping[str, int], lanes: _Lanes
) -> None:
    """One policy's panel: a lane per job, its stints as bars (spot hatched), preemptions
    and migrations marked."""
    jobs = lanes.jobs
    ax.set_title(
        _mpl_text(name + _missed_note(missed, name)),
        loc="left",
        fontsize=9,
        fontweight="bold",
        color=MISSED_COLOUR if name in missed else "black",
    )
    ax.set_yticks(range(len(jobs)))
    ax.set_yticklabels([_mpl_text(j[:28]) for j in jobs], fontsize=7 if len(jobs) > 15 else 8)
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
        return
    starts = _date_nums(sub["start"])
    ends = _date_nums(sub["end"])
    widths = np.maximum(ends - starts, (lanes.t1 - lanes.t0) * 1e-3)
    ys = np.array([lanes.y[j] for j in sub["job"]], dtype=np.float64)
    colours = [lanes.region_colour[r] for r in sub["region_label"]]
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


def _gantt_legend(fig: Figure, regions: Sequence[str], region_colour: Mapping[str, str]) -> None:
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


def plot_cumulative(
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
    names = [n for n in policy_metrics(results) if n in set(df["policy"])]
    names += sorted(set(df["policy"]) - set(names), key=_natural_key)
    all_styles = dict(styles)
    extra = policy_styles(list(styles) + [n for n in names if n not in styles])
    for n in names:
        all_styles.setdefault(n, extra[n])

    missed = missed_deadlines(policy_metrics(results))
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
