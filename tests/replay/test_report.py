"""Tests for the replay report writer (figures, HTML page and terminal table)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from PIL import Image
from rich.console import Console

from orchestrator.replay.metrics import TIMELINE_COLUMNS
from orchestrator.replay.report import (
    COLUMNS,
    MAX_GANTT_JOBS,
    format_table,
    summary,
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
    # egress is 2.50 USD for every policy: left out, and named in the caption
    assert len(table.columns) == len(COLUMNS)
    assert "Egress USD 2.50" in str(table.caption)
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


# -- a report that cannot mislead ---------------------------------------------------------


def _contest(**over: dict[str, Any]) -> dict[str, Any]:
    """spot-failover the cheapest that met every deadline; curtailment-threshold cheaper
    still, having run nothing and missed all three."""
    policies = {
        "on-demand": _metrics(10.0, 4.0, migrations=0, preemptions=0),
        "spot-failover": _metrics(3.0, 2.0),
        "heliotrope": _metrics(2.4, 1.0),
        "curtailment-threshold": _metrics(0.0, 0.0, deadlines_met=0, deadlines_missed=3),
        "oracle": _metrics(2.0, 0.9),
    }
    for name, changes in over.items():
        policies[name.replace("_", "-")] = {**policies[name.replace("_", "-")], **changes}
    return {"config": {"start": "2024-03-01T00:00:00Z"}, "policies": policies}


def _red_pixels(path: Path) -> int:
    with Image.open(path) as img:
        px = np.asarray(img.convert("RGB")).astype(int)
    target = np.array([0xB3, 0x26, 0x1E])
    return int((np.abs(px - target).sum(axis=2) < 40).sum())


def test_a_policy_that_missed_deadlines_is_marked_and_never_best(tmp_path: Path) -> None:
    results = _contest()
    page = write_report(results, _timeline(), _cumulative(), tmp_path).read_text("utf-8")
    row = next(line for line in page.splitlines() if "<th>curtailment-threshold" in line)
    assert 'class="missed"' in row and "✗ missed 3" in row
    assert "best" not in row  # cheapest and cleanest, but it ran nothing
    assert '<td class="num best">2.40</td>' in page  # heliotrope: best of those that met all
    console = Console(width=200, record=True)
    console.print(format_table(results))
    text = console.export_text()
    assert "curtailment-threshold — missed 3" in text
    # the plot: hollow red markers and a red label for it, none when nobody missed
    missed_red = _red_pixels(tmp_path / "cost_vs_carbon.png")
    clean = _contest(curtailment_threshold={"deadlines_missed": 0, "deadlines_met": 3})
    write_report(clean, _timeline(), _cumulative(), tmp_path / "clean")
    assert missed_red > 200 and _red_pixels(tmp_path / "clean" / "cost_vs_carbon.png") == 0


def test_the_oracle_is_a_bound_only_where_it_is_one(tmp_path: Path) -> None:
    bound = write_report(_contest(), pd.DataFrame(), pd.DataFrame(), tmp_path / "a")
    assert "<th>oracle (bound)</th>" in bound.read_text("utf-8")
    beaten = _contest(oracle={"usd": 2.9, "objective_usd": 2.9})
    page = write_report(beaten, pd.DataFrame(), pd.DataFrame(), tmp_path / "b").read_text()
    assert "<th>oracle (reference, not a bound)</th>" in page and "oracle (bound)" not in page
    assert "not a bound here: heliotrope met every deadline at a lower objective" in page
    console = Console(width=200, record=True)
    console.print(format_table(beaten))
    assert "(bound)" not in console.export_text()
    # a policy that beat it only by missing deadlines does not unmake the bound
    cheap_and_late = _contest(
        oracle={"usd": 2.5, "objective_usd": 2.5}, heliotrope={"deadlines_missed": 1}
    )
    assert (
        "oracle (bound)"
        in write_report(cheap_and_late, pd.DataFrame(), pd.DataFrame(), tmp_path / "c").read_text()
    )


def test_the_summary_says_it_in_words() -> None:
    text = summary(_contest())
    assert text.startswith(
        "heliotrope: 20% cheaper than spot-failover (the cheapest other "
        "policy that met every deadline), 50% less CO₂; 76% cheaper than "
        "on-demand, 75% less CO₂; all 3 deadlines met."
    )
    assert "curtailment-threshold missed 3 deadline(s)" in text
    assert "a bound on the objective" in text
    lost = summary(_contest(heliotrope={"usd": 3.3, "kg_co2": 2.2}))
    assert lost.startswith("heliotrope: 10% dearer than spot-failover")
    assert "10% more CO₂" in lost
    late = summary(_contest(heliotrope={"deadlines_missed": 2, "deadlines_met": 1}))
    assert "it missed 2 of 3 deadlines" in late and "not comparable" in late


def test_the_html_comes_from_the_jinja_template_and_escapes(tmp_path: Path) -> None:
    results = _contest()
    results["policies"]["<b>x</b>"] = _metrics(5.0, 5.0)
    page = write_report(results, pd.DataFrame(), pd.DataFrame(), tmp_path).read_text()
    assert '<p class="summary">heliotrope: ' in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert page.index('class="summary"') < page.index('class="metrics"')


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome", "headless_shell"):
        if found := shutil.which(name):
            return found
    return None


@pytest.mark.skipif(
    _chromium() is None,
    reason="no chromium on PATH: the laptop-screen check "
    "needs a headless browser (apt install chromium)",
)
def test_the_report_table_fits_a_laptop_screen_in_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    assert browser is not None
    results = _contest()
    report = write_report(results, _timeline(), _cumulative(), tmp_path)
    # A copy that measures itself (the report has no scripts of its own).
    probe = tmp_path / "probe.html"
    probe.write_text(
        report.read_text().replace(
            "</body>",
            (
                "<script>const t = document.querySelector('table.metrics');"
                "document.body.setAttribute('data-fit', String(t.getBoundingClientRect().right <= "
                "document.documentElement.clientWidth && t.parentElement.scrollWidth <= "
                "t.parentElement.clientWidth));</script></body>"
            ),
        )
    )
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [browser, *flags, "--window-size=1366,768", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert 'data-fit="true"' in dom
    shot = Path(os.environ.get("HELIOTROPE_TEST_ARTIFACTS", tmp_path)) / "report-1366.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [browser, *flags, "--window-size=1366,2600", f"--screenshot={shot}", report.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    _assert_png(shot)
