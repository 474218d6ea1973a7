"""Airflow distributed: the API server, the scheduler, the DAG processor and two Celery
workers (CeleryExecutor), Redis as broker (a database number of its own, flushed before and
after), PostgreSQL as the metadata database (a fresh database, dropped afterwards) and as
Heliotrope's state store (a schema of its own in that database). The signals and the
rebalance DAGs are triggered through the REST API and must succeed, with tasks run on both
workers, the polled samples and the controller's commit in the PostgreSQL store.

Needs apache-airflow-providers-celery (with celery < 5.7: provider 3.26.0 imports
``celery.backends.database.retry``, which celery 5.7 removed); skipped with the reason when
it, PostgreSQL or Redis is missing. About 100 s on two busy cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.scale.fleet import PG_URL, pg_unavailable, with_options

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REDIS = os.environ.get("HELIOTROPE_TEST_REDIS", "127.0.0.1:6379")
WORKERS = ("worker-1", "worker-2")
DAG_IDS = ("heliotrope_signals", "heliotrope_rebalance")
CELERY_PIN = "apache-airflow-providers-celery>=3.26 with celery[redis]>=5.5,<5.7"


def _why_not() -> str | None:
    missing = [d for d in DAG_IDS if not (REPO / "dags" / f"{d}.py").is_file()]
    if missing:
        return f"dags/ has no {', '.join(missing)}"
    reason = pg_unavailable()
    if reason:
        return reason
    host, port = REDIS.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            pass
    except OSError as exc:
        return f"Redis not reachable at {REDIS} ({exc}); set HELIOTROPE_TEST_REDIS"
    try:
        from airflow.providers.celery.executors import celery_executor  # noqa: F401
    except ImportError as exc:
        return f"the Celery executor cannot be imported ({exc}); pip install '{CELERY_PIN}'"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis(*command: str, db: int) -> str:
    """One Redis command over the wire protocol (no client library needed)."""
    host, port = REDIS.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5.0) as s:
        for cmd in (("SELECT", str(db)), command):
            s.sendall(
                f"*{len(cmd)}\r\n".encode()
                + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in cmd)
            )
        reply = b""
        while reply.count(b"\r\n") < 2:
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.split(b"\r\n")[1].decode()


def _free_redis_db() -> int:
    """A Redis database number nobody uses (empty), from 8 to 15."""
    for db in range(8, 16):
        if _redis("DBSIZE", db=db) == ":0":
            return db
    pytest.skip("Redis has no empty database among 8-15 for this test")


@contextlib.contextmanager
def _database() -> Iterator[str]:
    """A fresh PostgreSQL database; yields its URL (psycopg 3) and drops it afterwards."""
    import psycopg

    name = f"heliotrope_airflow_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(
        PG_URL.replace("postgresql+psycopg", "postgresql"), autocommit=True
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Cluster:
    url: str
    root: Path
    home: Path
    state_url: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else text

    def logs(self) -> str:
        return ", ".join(str(self.root / f"{n}.log") for n in self.procs)

    def alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited ({proc.returncode}); see {self.logs()}"


def _hostname_module(root: Path, name: str) -> str:
    """A module whose `name()` is this worker's name: task instances record it as their
    hostname, so the test sees which worker ran what."""
    pkg = root / f"pyhost_{name.replace('-', '_')}"
    pkg.mkdir()
    (pkg / "workername.py").write_text(f"def name():\n    return {name!r}\n")
    return str(pkg)


def _environment(
    root: Path, db_url: str, redis_db: int, port: int, home: Path, state_url: str, uk_url: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HELIOTROPE"))}
    env.update(
        {
            "PATH": f"{BIN}:{env.get('PATH', '')}",
            "PYTHONPATH": str(REPO),
            "AIRFLOW_HOME": str(root / "airflow"),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": db_url,  # psycopg 3 does async too
            "AIRFLOW__CELERY__BROKER_URL": f"redis://{REDIS}/{redis_db}",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{db_url}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(32),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "10",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            # Heliotrope: its home and signal sources through the Variable, its store here.
            "AIRFLOW_VAR_HELIOTROPE": json.dumps(
                {
                    "home": str(home),
                    "sources": ["uk-carbon"],
                    "regions": ["aws:eu-west-2", "gcp:us-central1"],
                }
            ),
            "HELIOTROPE_HOME": str(home),
            "HELIOTROPE_DB_URL": state_url,
            "HELIOTROPE_UK_CARBON_URL": uk_url,
        }
    )
    return env


def _start(cluster: Cluster, name: str, args: list[str], env: dict[str, str]) -> None:
    log = (cluster.root / f"{name}.log").open("wb")
    cluster.procs[name] = subprocess.Popen(
        [str(BIN / "airflow"), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=cluster.root,
    )


def _ours(marker: str) -> list[int]:
    mark = f"AIRFLOW_HOME={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
    return pids


def _stop(cluster: Cluster) -> None:
    """SIGTERM every process group we started, then SIGKILL what is left, including task
    processes that left their group (found by our AIRFLOW_HOME in their environment)."""
    marker = str(cluster.root / "airflow")
    for sig, grace_s in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        for proc in cluster.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        for pid in _ours(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if all(p.poll() is not None for p in cluster.procs.values()) and not any(
                _running(pid) for pid in _ours(marker)
            ):
                return
            time.sleep(0.5)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_ready(cluster: Cluster, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        cluster.alive()
        assert time.monotonic() < deadline, f"not ready in {timeout_s:.0f} s; see {cluster.logs()}"
        try:
            health = cluster.call("GET", "/api/v2/monitor/health")
            if all(
                health.get(c, {}).get("status") == "healthy"
                for c in ("metadatabase", "scheduler", "dag_processor")
            ):
                cluster.token = cluster.call("GET", "/auth/token")["access_token"]
                dags = {d["dag_id"] for d in cluster.call("GET", "/api/v2/dags?limit=100")["dags"]}
                if dags >= set(DAG_IDS):
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError):
            pass
        time.sleep(2.0)


def _run_dag(cluster: Cluster, dag_id: str, timeout_s: float = 300.0) -> tuple[str, list[Any]]:
    cluster.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run = cluster.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None})
    run_id = urllib.request.quote(str(run["dag_run_id"]), safe="")
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        cluster.alive()
        state = cluster.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")["state"]
        if state in ("success", "failed"):
            break
        time.sleep(2.0)
    cluster.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})
    tis = cluster.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
    return state, tis["task_instances"]


def _submit_job(env: dict[str, str], root: Path) -> None:
    jobs = root / "jobs.yaml"
    jobs.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": "lm",
                        "work_gpu_hours": 4.0,
                        "gpus": 1,
                        "gpu_types": ["L4"],
                        "throughput": {"L4": 1.0},
                        "start_offset_h": 0,
                        "deadline_h": 100,
                        "home_region": "us-east-1",
                        "checkpoint_size_gb": 0.01,
                        "command": [sys.executable, "-c", "pass"],
                    }
                ]
            }
        )
    )
    done = subprocess.run(
        [str(BIN / "heliotrope"), "jobs", "submit", str(jobs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_signals_and_rebalance_on_two_celery_workers(tmp_path: Path) -> None:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    from tests.dags.fake_sources import uk_carbon_server

    redis_db = _free_redis_db()
    _redis("FLUSHDB", db=redis_db)
    t0 = time.monotonic()
    with _database() as db_url, uk_carbon_server() as uk_url:
        import psycopg

        with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute("CREATE SCHEMA heliotrope")  # apart from Airflow's alembic_version
        state_url = with_options(db_url.replace("+psycopg", ""), "-csearch_path%3Dheliotrope")
        home = tmp_path / "home"
        home.mkdir()
        port = _free_port()
        env = _environment(tmp_path, db_url, redis_db, port, home, state_url, uk_url)
        cluster = Cluster(f"http://127.0.0.1:{port}", tmp_path, home, state_url)
        migrate = subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        _submit_job(env, tmp_path)  # Heliotrope's schema (Alembic) and one job, in PostgreSQL
        try:
            _start(cluster, "api-server", ["api-server", "--port", str(port)], env)
            _start(cluster, "scheduler", ["scheduler"], env)
            _start(cluster, "dag-processor", ["dag-processor"], env)
            for name in WORKERS:
                _start(
                    cluster,
                    name,
                    ["celery", "worker", "--concurrency", "1", "--celery-hostname", f"{name}@%h"],
                    {
                        **env,
                        "PYTHONPATH": f"{_hostname_module(tmp_path, name)}:{REPO}",
                        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "workername.name",
                        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(_free_port()),
                    },
                )
            _wait_ready(cluster)
            ready_s = time.monotonic() - t0
            results = {dag_id: _run_dag(cluster, dag_id) for dag_id in DAG_IDS}
        finally:
            _stop(cluster)
            _redis("FLUSHDB", db=redis_db)
        assert not _ours(str(tmp_path / "airflow")), "Airflow processes were left behind"
        from orchestrator.state import open_store

        store = open_store(state_url)
        try:
            version = store.version()
            jobs = [j.id for j in store.load()[0].jobs]
            import sqlalchemy as sa

            with store.engine.connect() as conn:
                samples = conn.scalar(sa.text("SELECT count(*) FROM signal_samples"))
        finally:
            store.close()

    hosts = {ti["hostname"] for _, tis in results.values() for ti in tis}
    summary = {
        d: (
            s,
            sorted((ti["task_id"], ti.get("map_index"), ti["state"], ti["hostname"]) for ti in tis),
        )
        for d, (s, tis) in results.items()
    }
    print(
        f"\nCelery: ready after {ready_s:.0f} s, done after {time.monotonic() - t0:.0f} s; "
        f"{summary}; Heliotrope store version {version}, {samples} samples"
    )
    for dag_id, (state, _tis) in results.items():
        assert state == "success", (dag_id, summary[dag_id], cluster.logs())
    assert hosts <= set(WORKERS) | {""}, hosts
    assert set(WORKERS) <= hosts, f"not every worker ran a task: {summary}"
    tick = [ti for ti in results["heliotrope_rebalance"][1] if ti["task_id"] == "tick"]
    assert [ti["state"] for ti in tick] == ["success"], summary  # ticked, not skipped
    assert jobs == ["lm"]
    assert version >= 1  # the rebalance tick committed to the PostgreSQL store
    assert samples and samples > 0  # the signals DAG wrote polled samples there
