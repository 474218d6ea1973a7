"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME (SQLite), the repo's dags/ folder, no
examples; a Heliotrope home per test with one tiny job submitted.

Airflow reads its configuration once, when it is first imported, so the environment is set
here, when pytest collects this directory, before any test imports Airflow.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
DAG_IDS = ("heliotrope_signals", "heliotrope_rebalance", "heliotrope_migrate", "heliotrope_replay")

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="heliotrope-airflow-"))
atexit.register(shutil.rmtree, _AIRFLOW_HOME, ignore_errors=True)

AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(_AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_AIRFLOW_HOME / 'airflow.db'}",
}
os.environ.update(AIRFLOW_ENV)

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """The metadata database, migrated once per session (`airflow db migrate`)."""
    from airflow.configuration import AIRFLOW_HOME

    if Path(AIRFLOW_HOME) != _AIRFLOW_HOME:  # imported before this conftest set the env
        pytest.skip(f"Airflow was configured before tests/dags set AIRFLOW_HOME ({AIRFLOW_HOME})")
    subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"],
        check=True,
        env={**os.environ, **AIRFLOW_ENV},
        capture_output=True,
        timeout=300,
    )
    return _AIRFLOW_HOME


def write_jobs(path: Path, *, sleep_s: float = 30.0, **over: object) -> Path:
    """One small single-GPU job whose command sleeps (the local provider runs it)."""
    entry: dict[str, object] = {
        "name": "lm",
        "work_gpu_hours": 4.0,
        "gpus": 1,
        "gpu_types": ["L4"],
        "throughput": {"L4": 1.0},
        "start_offset_h": 0,
        "deadline_h": 100,
        "home_region": "us-east-1",
        "checkpoint_size_gb": 0.01,
        "command": [sys.executable, "-c", f"import time; time.sleep({sleep_s})"],
    }
    entry.update(over)
    path.write_text(yaml.safe_dump({"jobs": [entry]}))
    return path


def stop_instances(home: Path) -> None:
    """Terminate whatever the local provider still runs for `home` (a test's jobs)."""
    old = os.environ.get("HELIOTROPE_HOME")
    os.environ["HELIOTROPE_HOME"] = str(home)
    try:
        from orchestrator.live.world import local_world

        world = local_world()
        ids = list(world.provider.list_instances(cluster=world.settings.cluster))
        if ids:
            world.provider.terminate(ids, request_id="tests-dags-cleanup")
    finally:
        if old is None:
            os.environ.pop("HELIOTROPE_HOME", None)
        else:
            os.environ["HELIOTROPE_HOME"] = old


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh Heliotrope home (`$HELIOTROPE_HOME`), with no Variable overriding it."""
    path = tmp_path / "home"
    path.mkdir()
    # The DAG plumbing runs on the built-in scenario (tests/dags/test_live_signals.py runs
    # the polled world).
    (path / "config.yaml").write_text("signals: scenario\n")
    monkeypatch.setenv("HELIOTROPE_HOME", str(path))
    monkeypatch.delenv("AIRFLOW_VAR_HELIOTROPE", raising=False)
    yield path
    stop_instances(path)


@pytest.fixture
def submitted(home: Path, tmp_path: Path) -> str:
    """`home` with the job ``lm`` submitted through the CLI's own command."""
    from orchestrator.live.commands import submit

    assert submit(write_jobs(tmp_path / "jobs.yaml")) == ["lm"]
    return "lm"
