"""The DAG files: they import without errors, each DAG has the tasks, schedule, run limits
and params it promises, and parsing a file imports nothing heavy (no orchestrator.replay,
pandas, torch, boto3, no SQLAlchemy-backed store): measured in a fresh interpreter."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dags.conftest import AIRFLOW_ENV, DAG_IDS, DAGS

# Modules a DAG file must not import while it is parsed. Airflow itself imports SQLAlchemy
# (its metadata DB) before any DAG file, so for SQLAlchemy the check is that the DAG file
# brings in none of the orchestrator modules that use it (the state store, the live world).
HEAVY = (
    "orchestrator.replay",
    "orchestrator.live",
    "orchestrator.signals",
    "orchestrator.state",
    "orchestrator.loop",
    "policies",
    "providers",
    "pandas",
    "numpy",
    "torch",
    "boto3",
    "botocore",
    "google.cloud",
    "matplotlib",
)

PARSE = r"""
import importlib.util, json, sys, time
from pathlib import Path

import airflow.sdk  # Airflow's own import cost, paid once per parsing process

path = Path(sys.argv[1])
before = set(sys.modules)
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("dag_under_test", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
exec_s = time.perf_counter() - t0
new = sorted(set(sys.modules) - before)
loaded = sorted(sys.modules)

from airflow.dag_processing.dagbag import DagBag

t0 = time.perf_counter()
bag = DagBag(dag_folder=str(path))
dagbag_s = time.perf_counter() - t0
print(json.dumps({
    "exec_s": exec_s,
    "dagbag_s": dagbag_s,
    "errors": {k: str(v)[-300:] for k, v in bag.import_errors.items()},
    "dags": sorted(bag.dag_ids),
    "new": new,
    "all": loaded,
}))
"""


def with_conf(params: Any, conf: dict[str, Any]) -> Any:
    """The DAG's params as a trigger with `conf` sees them (a copy; validate() checks)."""
    merged = copy.deepcopy(params)
    merged.update(conf)
    return merged


@pytest.fixture(scope="module")
def bag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_the_dag_folder_imports_without_errors(bag: Any) -> None:
    # Airflow 3's DagBag has no `include_examples` (examples are a bundle of their own, off
    # here: AIRFLOW__CORE__LOAD_EXAMPLES=False); the folder holds our four DAGs only.
    assert bag.import_errors == {}
    assert sorted(bag.dag_ids) == sorted(DAG_IDS)
    for dag_id in DAG_IDS:
        dag = bag.dags[dag_id]
        assert "heliotrope" in dag.tags and dag.catchup is False
        assert dag.doc_md and dag.description


def test_signals_one_mapped_task_per_family_every_5_minutes(bag: Any) -> None:
    from orchestrator.airflow_tasks import SIGNAL_FAMILIES

    dag = bag.dags["heliotrope_signals"]
    assert dag.schedule == "*/5 * * * *"
    assert dag.max_active_runs == 1
    want = {f"{f}.{t}" for f in SIGNAL_FAMILIES for t in ("regions", "poll")}
    assert set(dag.task_ids) == want
    for family in SIGNAL_FAMILIES:
        poll = dag.get_task(f"{family}.poll")
        assert poll.is_mapped, f"{family}.poll is mapped over regions"
        assert dag.get_task(f"{family}.regions").task_id in poll.upstream_task_ids


def test_rebalance_one_tick_every_15_minutes_never_overlapping(bag: Any) -> None:
    dag = bag.dags["heliotrope_rebalance"]
    assert dag.schedule == "*/15 * * * *"
    assert dag.max_active_runs == 1
    assert dag.task_ids == ["tick"]
    assert dag.get_task("tick").max_active_tis_per_dag == 1
    assert dag.dagrun_timeout is not None


def test_migrate_is_manual_with_a_form(bag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = bag.dags["heliotrope_migrate"]
    assert dag.schedule is None and dag.max_active_runs == 1
    assert dag.task_ids == ["migrate"]
    assert dag.get_task("migrate").retries == 0  # a refusal does not get better with retries
    params = dag.params
    assert list(params) == ["job", "region", "market", "dry_run", "force"]
    schema = {k: params.get_param(k).schema for k in params}
    assert schema["job"]["type"] == "string" and schema["job"]["minLength"] == 1
    assert schema["market"]["enum"] == ["current", "spot", "on_demand"]
    assert params["dry_run"] is True and params["force"] is False
    good = with_conf(params, {"job": "lm", "region": "europe-west4"})
    assert good.validate()["dry_run"] is True
    for bad in (
        {"region": "europe-west4"},
        {"job": "lm", "region": "x", "market": "cheap"},
        {"job": "lm", "region": "x", "dry_run": "yes"},
    ):
        with pytest.raises(ParamValidationError):
            with_conf(params, bad).validate()


def test_replay_is_manual_with_its_params(bag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = bag.dags["heliotrope_replay"]
    assert dag.schedule is None
    assert dag.task_ids == ["replay"]
    params = dag.params
    assert set(params) == {
        "trace_dir",
        "jobs_file",
        "window_start",
        "window_days",
        "policies",
        "carbon_price",
        "seed",
        "tick_minutes",
        "out_dir",
    }
    assert Path(params["jobs_file"]).is_file()
    assert params["policies"] == list(
        __import__("orchestrator.airflow_tasks").airflow_tasks.DEFAULT_REPLAY_POLICIES
    )
    with_conf(params, {"carbon_price": 50, "window_days": 3}).validate()
    for bad in ({"carbon_price": -1}, {"policies": []}, {"policies": ["nope"]}, {"window_days": 0}):
        with pytest.raises(ParamValidationError):
            with_conf(params, bad).validate()


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_parsing_a_dag_file_imports_nothing_heavy(dag_id: str) -> None:
    path = DAGS / f"{dag_id}.py"
    env = {**os.environ, **AIRFLOW_ENV}
    env.pop("HELIOTROPE_HOME", None)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", PARSE, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["errors"] == {} and got["dags"] == [dag_id]
    heavy = sorted(m for m in got["all"] if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == [], f"{path.name} imports {heavy[:8]} while parsed"
    assert "sqlalchemy" not in {m.split(".")[0] for m in got["new"]}
    ours = sorted(m for m in got["new"] if m.split(".")[0] in ("orchestrator", "policies"))
    assert ours == ["orchestrator", "orchestrator.airflow_tasks", "orchestrator.errors"]
    # Self-time of the imports the DAG file triggered, from -X importtime (microseconds).
    own = _importtime(done.stderr, set(got["new"]))
    print(
        f"\n{path.name}: module exec {got['exec_s'] * 1000:.0f} ms, DagBag(file) "
        f"{got['dagbag_s'] * 1000:.0f} ms, {len(got['new'])} new modules "
        f"({own / 1000:.0f} ms of imports); target < 500 ms"
    )


def _importtime(stderr: str, names: set[str]) -> int:
    total = 0
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = [p.strip() for p in line[len("import time:") :].split("|")]
        if len(parts) == 3 and parts[0].isdigit() and parts[2].strip() in names:
            total += int(parts[0])
    return total
