"""`dag.test()` of the rebalance, migrate, replay and signals DAGs with the local provider, end
to end in one process: Airflow's metadata DB in a throwaway AIRFLOW_HOME, Heliotrope's home
in tmp_path, one tiny job submitted through `orchestrator.live.commands.submit`.

The first `dag.test()` of a process builds Airflow's in-process execution API (~20 s on a
small machine); the later ones reuse it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dags.conftest import DAGS
from tests.dags.fake_sources import uk_carbon_server

pytestmark = pytest.mark.usefixtures("airflow_db")


@pytest.fixture(scope="module")
def dags(airflow_db: Path) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    return dict(bag.dags)


def run(dag: Any, conf: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """One `dag.test()`; the run and {task id (map index): (state, XCom return value)}."""
    dr = dag.test(run_conf=conf)
    out: dict[str, Any] = {}
    for ti in dr.get_task_instances():
        key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.rendered_map_index}]"
        value = (
            ti.xcom_pull(task_ids=ti.task_id, map_indexes=ti.map_index)
            if (ti.state == "success")
            else None
        )
        out[key] = (str(ti.state), value)
    return dr, out


def test_rebalance_ticks_the_controller(dags: dict[str, Any], submitted: str) -> None:
    dr, tis = run(dags["heliotrope_rebalance"])
    assert dr.state == "success", tis
    state, value = tis["tick"]
    assert state == "success"
    assert [r["job"] for r in value["fleet"]] == [submitted]
    assert value["events"] and value["events"][0]["job"] == submitted


def test_rebalance_skips_on_stale_signals_with_the_reason(
    dags: dict[str, Any], submitted: str, home: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (home / "config.yaml").write_text(yaml.safe_dump({"days": 1, "signals": "scenario"}))
    (home / "clock.json").write_text(json.dumps({"real_origin": "2020-01-01T00:00:00+00:00"}))
    _, tis = run(dags["heliotrope_rebalance"])
    assert tis["tick"][0] == "skipped"
    assert "signals are stale" in capfd.readouterr().out


def test_migrate_dry_run_then_a_real_move(
    dags: dict[str, Any], submitted: str, monkeypatch: pytest.MonkeyPatch, home: Path
) -> None:
    from orchestrator.live.commands import events_table, jobs_table
    from orchestrator.live.world import local_world

    # Settings through the Airflow Variable (an AIRFLOW_VAR_ environment variable here).
    monkeypatch.setenv("AIRFLOW_VAR_HELIOTROPE", json.dumps({"home": str(home)}))
    monkeypatch.setenv("HELIOTROPE_HOME", "/nonexistent")  # the Variable wins

    dag = dags["heliotrope_migrate"]
    dr, tis = run(dag, {"job": submitted, "region": "europe-west4", "dry_run": True})
    assert dr.state == "success", tis
    plan = tis["migrate"][1]
    assert plan["to"].startswith("gcp:europe-west4") and plan["started"] is False
    monkeypatch.setenv("HELIOTROPE_HOME", str(home))
    store = local_world().open_store()
    assert events_table(store, submitted) == []

    dr, tis = run(dag, {"job": submitted, "region": "europe-west4", "dry_run": False})
    assert dr.state == "success", tis
    assert tis["migrate"][1]["started"] is True
    (row,) = jobs_table(store)
    assert row["where"].startswith("gcp:europe-west4")


def test_a_refused_migration_fails_the_run_with_the_clis_reason(
    dags: dict[str, Any], submitted: str, capfd: pytest.CaptureFixture[str]
) -> None:
    dr, tis = run(dags["heliotrope_migrate"], {"job": submitted, "region": "mars-1"})
    assert dr.state == "failed" and tis["migrate"][0] == "failed"
    out = capfd.readouterr().out
    assert "--to: expected a region with an offer this job may use" in out
    assert "AirflowFailException" in out


def test_replay_reports_its_path_in_the_log_and_xcom(
    dags: dict[str, Any],
    home: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.dags.test_task_bodies import replay_jobs

    caplog.set_level("INFO", logger="orchestrator.airflow_tasks")  # Airflow's task level

    conf = {
        "jobs_file": str(replay_jobs(tmp_path / "jobs.yaml")),
        "window_start": "2024-04-01T00:00:00Z",
        "window_days": 1.5,
        "policies": ["on-demand", "carbon-greedy"],
        "carbon_price": 100.0,
    }
    dr, tis = run(dags["heliotrope_replay"], conf)
    assert dr.state == "success", tis
    value = tis["replay"][1]
    report = Path(value["report"])
    assert report.is_file() and report.is_relative_to(home / "replays")
    assert Path(value["results"]).is_file()
    assert f"replay report: {report}" in capfd.readouterr().out + caplog.text
    assert set(value["policies"]) == {"on-demand", "carbon-greedy"}


def test_signals_polls_each_family_per_region(
    dags: dict[str, Any], home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.signals.poll import read_samples

    monkeypatch.setenv(
        "AIRFLOW_VAR_HELIOTROPE",
        json.dumps({"sources": ["uk-carbon"], "regions": ["aws:eu-west-2", "gcp:us-central1"]}),
    )
    with uk_carbon_server() as url:
        monkeypatch.setenv("HELIOTROPE_UK_CARBON_URL", url)
        dr, tis = run(dags["heliotrope_signals"])
    assert dr.state == "success", tis
    states = {k: v[0] for k, v in tis.items()}
    assert states["carbon.poll[aws:eu-west-2]"] == "success"
    assert states["carbon.poll[gcp:us-central1]"] == "skipped"  # uk-carbon covers GB only
    assert states["aws.poll[aws:eu-west-2]"] == "skipped"  # no aws source enabled
    assert tis["aws.regions"][1] == ["aws:eu-west-2"]
    assert tis["gcp.regions"][1] == ["gcp:us-central1"]
    assert tis["carbon.regions"][1] == ["aws:eu-west-2", "gcp:us-central1"]
    polled = tis["carbon.poll[aws:eu-west-2]"][1]
    assert polled["rows"] > 0 and polled["trace_dir"] == str(home / "signals")
    assert len(read_samples(home / "signals")) == polled["rows"]
