"""Tests for the replay report writer (figures, HTML page and terminal table)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import pandas as pd
import pytest
from PIL import Image
from rich.console import Console

from orchestrator.replay.metrics import TIMELINE_COLUMNS
from orchestrator.replay.report import (
    COLUMNS,
    MAX_GANTT_JOBS,
    format_table,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("cost_vs_carbon.png", "gantt.png", "cumulative_cost.png")
T0 = pd.Timestamp("2024-03-01T00:00:00Z")


def _metrics(usd: float, kg: float, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "usd": usd,
        "kg_co2": kg,
        "kg_co2_marginal": kg * 1.4,
        "kwh": 1000.0,
        "curtailed_energy_share": 0.125,
        "deadlines_met": 3,
        "deadlines_missed": 0,
        "infeasible": 0,
        "migrations": 1,
        "preemptions": 1,
        "egress_usd": 2.5,
        "mean_completion_h": 5.5,
        "objective_usd": usd + kg * 0.05,
    }
    base.update(over)
    return base


def _results() -> dict[str, Any]:
    return {
        "config": {
            "traces": "shared/data/traces",
            "jobs": "examples/jobs.yaml",
            "carbon_usd_per_tonne": 50.0,
            "start": "2024-03-01T00:00:00Z",
            "end": "2024-03-02T00:00:00Z",
            "tick_s": 300,
        },
        "policies": {
            "on-demand": _metrics(
                1234.5, 410.0, migrations=0, preemptions=0, curtailed_energy_share=0.02
            ),
            "heliotrope": _metrics(612.25, 150.75, deadlines_met=4, mean_completion_h=float("nan")),
            "<script>": _metrics(
                800.0, 300.0, deadlines_missed=2, infeasible=1, mean_completion_h=None
            ),
        },
    }


def _stint(
    policy: str,
    job: str,
    start_h: float,
    end_h: float,
    *,
    region: str = "us-east-1",
    market: str = "spot",
    end_reason: str = "finished",
) -> dict[str, Any]:
    return {
        "policy": policy,
        "job": job,
        "start": T0 + pd.Timedelta(hours=start_h),
        "end": T0 + pd.Timedelta(hours=end_h),
        "offer_id": f"{region}-{market}-h100",
        "cloud": "aws",
        "region": region,
        "zone": f"{region}a",
        "market": market,
        "gpu_type": "H100",
        "usd": 10.0 * (end_h - start_h),
        "kg_co2": 2.0 * (end_h - start_h),
        "end_reason": end_reason,
    }


def _timeline() -> pd.DataFrame:
    rows = [
        _stint("on-demand", "job-1", 0, 6, market="on_demand"),
        _stint("on-demand", "job-2", 1, 8, market="on_demand"),
        _stint("heliotrope", "job-1", 0, 2, end_reason="preempted"),
        _stint("heliotrope", "job-1", 2.2, 5, region="eu-north-1", end_reason="migrated"),
        _stint("heliotrope", "job-1", 5.5, 7, region="ca-central-1", market="on_demand"),
        _stint("heliotrope", "job-2", 3, 9, region="eu-north-1"),
        _stint("<script>", "job-2", 0, 12, end_reason="replay_end"),
    ]
    return pd.DataFrame(rows)


def _cumulative() -> pd.DataFrame:
    rows = []
    for policy, rate in (("on-demand", 100.0), ("heliotrope", 50.0), ("<script>", 70.0)):
        for h in range(0, 13):
            rows.append(
                {
                    "policy": policy,
                    "time": T0 + pd.Timedelta(hours=h),
                    "usd": rate * h,
                    "kg_co2": rate * h / 3,
                }
            )
    return pd.DataFrame(rows)


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC
    pixels = mpimg.imread(path)
    assert pixels.ndim == 3
    assert pixels.shape[0] > 100
    assert pixels.shape[1] > 100
    with Image.open(path) as img:
        assert img.format == "PNG"
        assert img.size == (pixels.shape[1], pixels.shape[0])


def test_write_report_writes_figures_and_html(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "report"
    path = write_report(_results(), _timeline(), _cumulative(), out)
    assert path == out / "report.html"
    for name in FIGURES:
        _assert_png(out / name)

    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    for name in FIGURES:
        assert f'<img src="{name}"' in page
    assert "<script" not in page.lower().replace("&lt;script&gt;", "")
    assert "&lt;script&gt;" in page
    for name in ("on-demand", "heliotrope"):
        assert f"<th>{name}</th>" in page
    # numbers formatted: thousands separators, 2 dp money, percentages, hours
    assert "1,234.50" in page
    assert "612.25" in page
    assert "150.75" in page
    assert "12.5%" in page
    assert "2.0%" in page
    assert '<td class="num">5.5</td>' in page
    assert "—" in page  # NaN and None completion times
    # config table
    assert "carbon_usd_per_tonne" in page
    assert "tick_s" in page
    # best values highlighted: heliotrope has the lowest cost
    assert '<td class="num best">612.25</td>' in page
    assert '<td class="num best">1,234.50</td>' not in page
    # self-contained: no external scripts or stylesheets
    assert "http://" not in page
    assert "https://" not in page
    assert "<link" not in page


def test_empty_timeline(tmp_path: Path) -> None:
    empty_tl = pd.DataFrame(columns=TIMELINE_COLUMNS)
    empty_cum = pd.DataFrame(columns=["policy", "time", "usd", "kg_co2"])
    path = write_report(_results(), empty_tl, empty_cum, tmp_path)
    for name in FIGURES:
        _assert_png(tmp_path / name)
    page = path.read_text(encoding="utf-8")
    assert "No stints" in page
    assert "heliotrope" in page


def test_completely_empty_frames_and_no_policies(tmp_path: Path) -> None:
    path = write_report({"config": {}, "policies": {}}, pd.DataFrame(), pd.DataFrame(), tmp_path)
    for name in FIGURES:
        _assert_png(tmp_path / name)
    assert "No policies" in path.read_text(encoding="utf-8")
    assert format_table({"policies": {}}).row_count == 0


def test_single_policy(tmp_path: Path) -> None:
    results = {"config": {"tick_s": 60}, "policies": {"oracle": _metrics(10.0, 1.0)}}
    timeline = _timeline().assign(policy="oracle")
    cumulative = _cumulative().query("policy == 'heliotrope'").assign(policy="oracle")
    path = write_report(results, timeline, cumulative, tmp_path)
    for name in FIGURES:
        _assert_png(tmp_path / name)
    page = path.read_text(encoding="utf-8")
    assert "oracle" in page
    assert 'class="num best"' not in page  # nothing to compare against


def test_oracle_is_not_ranked(tmp_path: Path) -> None:
    results = _results()
    results["policies"]["oracle"] = _metrics(1.0, 0.5)
    page = write_report(results, _timeline(), _cumulative(), tmp_path).read_text("utf-8")
    assert '<tr class="reference"><th>oracle (bound)</th>' in page
    assert '<td class="num best">612.25</td>' in page


def test_many_jobs_truncated(tmp_path: Path) -> None:
    n_jobs = MAX_GANTT_JOBS + 5
    rows = [
        _stint(
            policy,
            f"job-{i}",
            i * 0.5,
            i * 0.5 + 3,
            end_reason="preempted" if i % 7 == 0 else "finished",
        )
        for policy in ("on-demand", "heliotrope")
        for i in range(n_jobs)
    ]
    results = {
        "config": {},
        "policies": {p: _metrics(1.0, 1.0) for p in ("on-demand", "heliotrope")},
    }
    page = write_report(results, pd.DataFrame(rows), _cumulative(), tmp_path).read_text("utf-8")
    _assert_png(tmp_path / "gantt.png")
    assert f"first {MAX_GANTT_JOBS} of {n_jobs} jobs" in page


def test_dollar_and_markup_in_names_do_not_break_figures(tmp_path: Path) -> None:
    results = {
        "config": {"note": "a & b"},
        "policies": {"$cheap$": _metrics(1.0, 2.0), "[bold]x": _metrics(2.0, 1.0)},
    }
    tl = _timeline().replace({"policy": {"on-demand": "$cheap$", "heliotrope": "[bold]x"}})
    page = write_report(results, tl, pd.DataFrame(), tmp_path).read_text("utf-8")
    assert "a &amp; b" in page
    table = format_table(results)
    console = Console(width=250, record=True)
    console.print(table)
    text = console.export_text()
    assert "[bold]x" in text
    assert "$cheap$" in text


def test_format_table_one_row_per_policy() -> None:
    results = _results()
    table = format_table(results)
    assert table.row_count == len(results["policies"])
    assert len(table.columns) == 1 + len(COLUMNS)
    console = Console(width=300, record=True)
    console.print(table)
    text = console.export_text()
    for name in results["policies"]:
        assert name in text
    assert "1,234.50" in text
    assert "12.5%" in text
    assert "—" in text


@pytest.mark.parametrize("value", [None, float("nan"), math.inf, "n/a"])
def test_missing_values_render_as_dash(tmp_path: Path, value: Any) -> None:
    results = {
        "config": {},
        "policies": {"a": _metrics(1.0, 1.0) | {"usd": value}, "b": _metrics(2.0, 2.0)},
    }
    page = write_report(results, pd.DataFrame(), pd.DataFrame(), tmp_path).read_text("utf-8")
    assert '<th>a</th><td class="num">—</td>' in page
