"""The per-policy table of a replay: which columns are worth showing, the best value per
column among the policies that met every deadline, and the terminal rendering.

Policies named in `REFERENCE_POLICIES` (the clairvoyant ``oracle``) are bounds, not
contenders: they are shown but never highlighted as "best".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rich.markup import escape as rich_escape
from rich.table import Table

REFERENCE_POLICIES: frozenset[str] = frozenset({"oracle"})
MISSING = "—"

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


def as_float(value: Any) -> float | None:
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


def policy_metrics(results: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    raw = results.get("policies") or {}
    out: dict[str, Mapping[str, Any]] = {}
    for name, metrics in raw.items():
        out[str(name)] = metrics if isinstance(metrics, Mapping) else {}
    return out


def missed_deadlines(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Policies that missed deadlines (of the feasible jobs), and how many."""
    out = {}
    for name, metrics in policies.items():
        missed = as_float(metrics.get("deadlines_missed"))
        if missed is not None and missed > 0:
            out[name] = int(missed)
    return out


def objective_of(metrics: Mapping[str, Any]) -> float | None:
    value = as_float(metrics.get("objective_usd"))
    return value if value is not None else as_float(metrics.get("usd"))


def beaten_by(results: Mapping[str, Any], reference: str) -> list[str]:
    """The policies that met every deadline at a lower objective than `reference`: where
    there are any, the reference is no bound (e.g. the oracle's hindsight model differs
    from the replay's)."""
    policies = policy_metrics(results)
    missed = missed_deadlines(policies)
    ref = objective_of(policies.get(reference, {}))
    if ref is None:
        return []
    tol = 1e-6 * max(1.0, abs(ref))
    return [
        n
        for n, m in policies.items()
        if n != reference
        and n not in missed
        and (v := objective_of(m)) is not None
        and v < ref - tol
    ]


def ranked_policies(results: Mapping[str, Any]) -> list[str]:
    """Who may be ranked: not a reference, no missed deadline. With only references, the
    references (a lone oracle still has its numbers, just nothing to beat)."""
    policies = policy_metrics(results)
    missed = missed_deadlines(policies)
    names = [n for n in policies if n not in REFERENCE_POLICIES]
    if not names:
        return [n for n in policies if n not in missed]
    return [n for n in names if n not in missed]


def shown_columns(results: Mapping[str, Any]) -> tuple[tuple[Column, ...], list[str]]:
    """The columns worth a place on a laptop screen, and a note for each one left out
    because every policy shows the same value (``Curtailed energy 0.0%``)."""
    policies = policy_metrics(results)
    keep, dropped = [], []
    for col in COLUMNS:
        texts = {_format_value(as_float(m.get(col.key)), col.kind) for m in policies.values()}
        if col.key not in ALWAYS_SHOWN and len(policies) > 1 and len(texts) == 1:
            dropped.append(f"{col.header} {texts.pop()}")
            continue
        keep.append(col)
    return tuple(keep), dropped


def table_rows(results: Mapping[str, Any], columns: Sequence[Column] | None = None) -> list[Row]:
    """Formatted rows with the best value(s) per column flagged.

    Best is judged on the displayed (rounded) value so visual ties are all highlighted,
    among the contenders only (no reference, no policy that missed a deadline), and only
    when the column is not constant.
    """
    columns = COLUMNS if columns is None else columns
    policies = policy_metrics(results)
    names = list(policies)
    missed = missed_deadlines(policies)
    contenders = ranked_policies(results)
    # A reference is one only beside something to compare with (a lone oracle is a policy).
    others = [n for n in names if n not in REFERENCE_POLICIES]
    references = {n for n in names if n in REFERENCE_POLICIES} if others else set()
    best: dict[str, set[str]] = {}
    for col in columns:
        shown = {
            n: _display_value(v, col.kind)
            for n in contenders
            if (v := as_float(policies[n].get(col.key))) is not None
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
                _format_value(as_float(metrics.get(col.key)), col.kind),
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
                bound=reference and name not in missed and not beaten_by(results, name),
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
    columns, dropped = shown_columns(results)
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
    for row in table_rows(results, columns):
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
