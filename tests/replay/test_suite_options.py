"""Suite options for the sweeps (issue 14): comma lists run their cross product, egress and
transfer bandwidth are options, the description states the actual settings, `--timeline`
prints one job's placements per policy beside the oracle's, and the tables report the mean
over non-trivial windows and the worst window. On ../shared/data (skipped without it)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.costs import move_cost
from orchestrator.errors import InputError
from orchestrator.loop import LoopOptions
from orchestrator.model import Location
from orchestrator.replay.runner import run_policy
from orchestrator.replay.suites import (
    ORACLE,
    carbon_year,
    case_grid,
    cbl_v100,
    run_suite,
    skynomad_h100,
    suite_timelines,
)
from policies.registry import make_policy

pytestmark = pytest.mark.traces


def test_skynomad_lists_run_their_cross_product(shared_data: Path) -> None:
    suite = skynomad_h100(
        shared_data,
        {
            "deadline_ratio": "1.2,2",
            "checkpoint_gb": "0,500",
            "cold_start_hours": [0.1, 0.2],
            "start_ticks": "0",
        },
    )
    labels = [c.setting for c in suite.cases]
    assert len(labels) == 8 == len(set(labels))
    assert labels[0] == "ratio 1.2, ckpt 0 GB, cold 0.1 h"
    assert labels[-1] == "ratio 2, ckpt 500 GB, cold 0.2 h"
    for case in suite.cases:
        (job,) = case.jobs
        parts = dict(p.split(" ", 1) for p in case.setting.split(", "))
        assert job.cold_start_h == float(parts["cold"].removesuffix(" h"))
        assert job.checkpoint_size_gb == float(parts["ckpt"].removesuffix(" GB"))
        # The artifact's deadline (311 ticks), the work from the ratio.
        assert (job.deadline - job.start) == timedelta(seconds=311 * 600)
        assert job.work_gpu_hours == pytest.approx(311 * 600 / 3600 / float(parts["ratio"]))
    assert (
        "work = deadline / ratio 1.2, 2 (43.194, 25.917 h), cold start 0.1, 0.2 h, "
        "checkpoint 0, 500 GB, egress 0.02 USD/GB, instant checkpoint copies"
    ) in suite.description
    assert suite.config["cold_start_hours"] == [0.1, 0.2]


def test_skynomad_work_hours_list_sets_the_deadline_and_says_so(shared_data: Path) -> None:
    suite = skynomad_h100(
        shared_data, {"work_hours": "6,12", "deadline_ratio": 2.0, "start_ticks": [0]}
    )
    assert [c.setting for c in suite.cases] == ["work 6 h", "work 12 h"]
    assert [c.jobs[0].deadline - c.jobs[0].start for c in suite.cases] == [
        timedelta(hours=12),
        timedelta(hours=24),
    ]
    assert "work 6, 12 h, deadline = work x ratio 2" in suite.description
    assert "51.833" not in suite.description


def test_egress_and_transfer_options_reach_the_loop(shared_data: Path) -> None:
    suite = skynomad_h100(
        shared_data, {"egress_usd_per_gb": "0.05", "transfer_gbps": 10, "start_ticks": "311"}
    )
    (case,) = suite.cases
    assert case.settings.egress_usd_per_gb == 0.05
    assert case.settings.transfer_time and case.settings.transfer_gbps == 10.0
    assert "egress 0.05 USD/GB, copies at 10 Gbit/s" in suite.description
    (job,) = case.jobs
    move = move_cost(
        job, Location("gcp", "us-central1"), Location("gcp", "europe-west1"), case.settings
    )
    assert move.egress_usd == pytest.approx(0.05 * 50)
    assert move.transfer_h == pytest.approx(50 * 8 / 10 / 3600)
    # spot-failover chases spot across regions in this window: every move is billed at 0.05.
    grid = case_grid(case)
    run = run_policy(
        make_policy("spot-failover"), case.jobs, grid, options=LoopOptions(settings=case.settings)
    )
    egress = float(run.fleet.egress_usd[0])
    assert egress > 0 and (egress / 2.5) == pytest.approx(round(egress / 2.5))


def test_cbl_lists_and_deadline_ratio(shared_data: Path) -> None:
    suite = cbl_v100(
        shared_data,
        {
            "work_hours": "24,48",
            "checkpoint_gb": "50,500",
            "slack_hours": 4,
            "cold_start_hours": 0.2,
            "start_ticks": "0",
        },
    )
    assert [c.setting for c in suite.cases] == [
        "slack 4 h, cold 0.2 h, work 24 h, ckpt 50 GB",
        "slack 4 h, cold 0.2 h, work 24 h, ckpt 500 GB",
        "slack 4 h, cold 0.2 h, work 48 h, ckpt 50 GB",
        "slack 4 h, cold 0.2 h, work 48 h, ckpt 500 GB",
    ]
    assert "work 24, 48 h, slack 4 h, cold start 0.2 h, checkpoint 50, 500 GB" in (
        suite.description
    )
    by_ratio = cbl_v100(shared_data, {"deadline_ratio": "1.5", "start_ticks": "0"})
    assert [c.setting for c in by_ratio.cases] == [
        "ratio 1.5, cold 0.05 h",
        "ratio 1.5, cold 0.2 h",
    ]
    (job,) = by_ratio.cases[0].jobs
    assert job.deadline - job.start == timedelta(hours=72)


@pytest.mark.parametrize(
    ("suite", "options", "field"),
    [
        ("skynomad-h100", {"deadline_ratio": "1.2,abc"}, "deadline_ratio"),
        ("skynomad-h100", {"cold_start_hours": "-1"}, "cold_start_hours"),
        ("skynomad-h100", {"transfer_gbps": "0"}, "transfer_gbps"),
        ("skynomad-h100", {"egress_usd_per_gb": "0.1,0.2"}, "egress_usd_per_gb"),
        ("cbl-v100", {"deadline_ratio": 1.5, "slack_hours": 4}, "options"),
        ("carbon-year", {"checkpoint_gb": 50}, "options"),
        ("skynomad-h100", {"jobs_alone": True}, "jobs_alone"),  # one job a window already
    ],
)
def test_bad_options_name_the_field(
    shared_data: Path, suite: str, options: dict[str, object], field: str
) -> None:
    with pytest.raises(InputError, match=field):
        run_suite(suite, shared_data, [], options)


def test_carbon_year_jobs_alone_replays_each_job_on_its_windows_world(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`jobs_alone`: one case per job, named by the job, on the window's world: the same
    offers (those its GPUs allow), prices and spot draws as the fleet's case."""
    options = {"windows": 1, "jobs_per_window": 3, "carbon_prices": "0"}
    (fleet,) = carbon_year(shared_data, options).cases
    alone = carbon_year(shared_data, {**options, "jobs_alone": True})
    assert [c.jobs for c in alone.cases] == [(job,) for job in fleet.jobs]
    assert [c.window for c in alone.cases] == [job.id for job in fleet.jobs]
    assert alone.description.endswith(", each job alone") and alone.config["jobs_alone"]
    world = case_grid(fleet)
    column = {o.id: k for k, o in enumerate(world.offers)}
    for case in alone.cases:
        assert (case.start, case.end, case.settings) == (fleet.start, fleet.end, fleet.settings)
        grid = case_grid(case)
        (job,) = case.jobs
        assert {o.id for o in grid.offers} == {o.id for o in world.offers if job.allows(o.gpu_type)}
        cols = [column[o.id] for o in grid.offers]
        assert (grid.spot_capacity == world.spot_capacity[:, cols]).all()
        assert grid.usd_per_hour.tobytes() == world.usd_per_hour[:, cols].tobytes()

    args = ["bench", "policies", "--suite", "carbon-year", "--data", str(shared_data)]
    args += ["--windows", "1", "--jobs-per-window", "2", "--carbon-prices", "0"]
    args += ["--policies", "spot-failover", "--out", str(tmp_path), "--jobs-alone"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(", each job alone")
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["config"]["jobs_alone"] is True
    assert sorted((w["window"], w["policy"]) for w in doc["windows"]) == sorted(
        (job.id, policy) for job in fleet.jobs[:2] for policy in (ORACLE, "spot-failover")
    )


def test_summaries_report_non_trivial_mean_and_worst_window(shared_data: Path) -> None:
    result = run_suite("skynomad-h100", shared_data, ["spot-failover"], {"start_ticks": "0,311"})
    rows = {(w.window, w.policy): w for w in result.windows}
    # t0: the oracle runs in the cheapest zone from the first tick to the end; t311: not.
    assert rows[("t0", ORACLE)].trivial and not rows[("t311", ORACLE)].trivial
    failover = result.policy("spot-failover")
    assert failover.windows == 2 and failover.nontrivial_windows == 1
    hard = rows[("t311", "spot-failover")].regret
    easy = rows[("t0", "spot-failover")].regret
    assert hard is not None and easy is not None
    assert failover.nontrivial_mean_ratio == pytest.approx(1 + hard)
    assert failover.worst_ratio == pytest.approx(1 + max(hard, easy))
    assert failover.worst_window == "t311"
    oracle = result.policy(ORACLE)
    assert oracle.nontrivial_mean_ratio == oracle.worst_ratio == 1.0
    table = result.format_table()
    assert "non-triv" in table and "(trivial)" in table
    doc = json.loads(json.dumps(result.to_json()))
    assert doc["summary"][1]["worst_window"] == "t311"
    assert doc["summary"][1]["nontrivial_windows"] == 1


def test_timeline_places_the_job_tick_by_tick(shared_data: Path) -> None:
    (timeline,) = suite_timelines(
        "skynomad-h100", shared_data, ["spot-failover"], {"start_ticks": "1244"}, "t1244"
    )
    assert timeline.policies == (ORACLE, "spot-failover")
    oracle = [row[0] for row in timeline.cells]
    failover = [row[1] for row in timeline.cells]
    assert oracle[0].endswith("spot*")  # the cold start
    # The trace reclaims europe-west1-c spot under both at the same tick: the oracle waits,
    # spot-failover relaunches elsewhere at once.
    k = next(i for i, c in enumerate(oracle) if c.endswith("!"))
    assert oracle[k] == "idle !" and failover[k].endswith("spot* !")
    assert oracle[-1] == failover[-1] == "done"
    assert all(timeline.met)
    result = run_suite("skynomad-h100", shared_data, ["spot-failover"], {"start_ticks": "1244"})
    assert list(timeline.usd) == pytest.approx([w.usd for w in result.windows])
    text = timeline.format()
    assert "oracle" in text.splitlines()[1] and "spot-failover" in text.splitlines()[1]
    assert text.splitlines()[-1].split()[0] == "deadline"
    with pytest.raises(InputError, match="t1244@t1244"):
        suite_timelines("skynomad-h100", shared_data, [], {"start_ticks": "1244"}, "t1")


def test_cli_sweep_and_timeline(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [
        "bench",
        "policies",
        "--suite",
        "skynomad-h100",
        "--data",
        str(shared_data),
        "--policies",
        "spot-failover",
        "--start-ticks",
        "0",
        "--out",
        str(tmp_path),
    ]
    assert main([*base, "--cold-start-hours", "0.1,0.2", "--checkpoint-gb", "0,50"]) == 0
    out = capsys.readouterr().out
    for label in ("cold 0.1 h", "cold 0.2 h"):
        assert f"ratio 1.5, ckpt 0 GB, {label}" in out
    assert "cold start 0.1, 0.2 h, checkpoint 0, 50 GB" in out.splitlines()[0]
    assert json.loads((tmp_path / "results.json").read_text())["config"]["checkpoint_gb"] == [
        0.0,
        50.0,
    ]
    assert main([*base, "--timeline", "t0@t0"]) == 0
    assert out != (out := capsys.readouterr().out) and "timeline of job t0, window t0" in out
    (tmp_path / "results.json").unlink()
    assert main([*base, "--deadline-ratio", "fast"]) == 2
    assert "deadline_ratio" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()  # bad input writes nothing


def test_oracle_from_an_earlier_run_gives_the_same_ratios(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = {"start_ticks": "311,622", "deadline_ratio": "1.2"}
    full = run_suite("skynomad-h100", shared_data, ["heliotrope", "spot-failover"], options)
    first = run_suite("skynomad-h100", shared_data, ["spot-failover"], options)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(first.to_json()))
    reused = run_suite("skynomad-h100", shared_data, ["heliotrope"], options, oracle_from=path)
    assert reused.policies == (ORACLE, "heliotrope")
    assert "oracle read from" in reused.description
    assert [(w.window, w.policy) for w in reused.windows] == [
        ("t311", ORACLE),
        ("t311", "heliotrope"),
        ("t622", ORACLE),
        ("t622", "heliotrope"),
    ]
    rows = {(w.window, w.policy): w for w in full.windows}
    for w in reused.windows:
        assert w.objective_usd == pytest.approx(rows[(w.window, w.policy)].objective_usd)
        assert w.regret == pytest.approx(rows[(w.window, w.policy)].regret, abs=1e-6)
        assert w.trivial == rows[(w.window, w.policy)].trivial
    mine, theirs = reused.policy("heliotrope"), full.policy("heliotrope")
    assert mine.regret == pytest.approx(theirs.regret, abs=1e-6)
    assert mine.nontrivial_windows == theirs.nontrivial_windows
    assert mine.worst_window == theirs.worst_window

    # Another setting's results are refused by name, and the CLI writes nothing.
    with pytest.raises(InputError, match="--oracle-from"):
        run_suite(
            "skynomad-h100", shared_data, ["heliotrope"], {"start_ticks": "311"}, oracle_from=path
        )
    with pytest.raises(InputError, match="policies"):
        run_suite("skynomad-h100", shared_data, [], options, oracle_from=path)
    out = tmp_path / "out"
    args = ["bench", "policies", "--suite", "skynomad-h100", "--data", str(shared_data)]
    args += ["--policies", "heliotrope", "--start-ticks", "311", "--out", str(out)]
    assert main([*args, "--oracle-from", str(path)]) == 2
    assert "--oracle-from" in capsys.readouterr().err
    assert not out.exists()
    (tmp_path / "bad.json").write_text("{")
    assert main([*args, "--oracle-from", str(tmp_path / "bad.json")]) == 2
    assert "a suite's results.json" in capsys.readouterr().err
