"""`airflow standalone` end to end, started by the same script as `make airflow`
(infra/airflow/standalone.sh) in a throwaway AIRFLOW_HOME on a free port: wait for health,
get a token, trigger `heliotrope_migrate` through the REST API with params (a dry run, a
real placement, a real move, a refused one) and `heliotrope_replay`, watch each run end as
expected and the job move; then a headless Chromium screenshot of the DAG list, kept in
out/test-artifacts/. The server and everything it started are stopped at the end.

About two minutes on a small machine; part of `make test` (the brief: end-to-end tests
that start Airflow are in it, sized to fit).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.dags.conftest import DAG_IDS, REPO, stop_instances, write_jobs

pytestmark = [pytest.mark.timeout(900)]

ARTIFACTS = Path(os.environ.get("HELIOTROPE_ARTIFACTS", REPO / "out" / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@dataclass
class Server:
    url: str
    home: Path
    airflow_home: Path
    log: Path
    token: str = ""
    started_s: float = 0.0
    healthy_after_s: float = 0.0

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else text

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        run = self.call(
            "POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf}
        )
        return str(run["dag_run_id"])

    def wait(self, dag_id: str, run_id: str, timeout_s: float = 180.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}")["state"]
            if state in ("success", "failed"):
                return str(state)
            time.sleep(1.0)
        raise AssertionError(
            f"{dag_id} {run_id} did not finish in {timeout_s:.0f} s; see {self.log}"
        )

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        path = (
            f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances/{task_id}"
            "/xcomEntries/return_value"
        )
        return self.call("GET", path)["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        path = f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances/{task_id}/logs/1"
        got = self.call("GET", path)
        content = got.get("content", got) if isinstance(got, dict) else got
        return json.dumps(content) if not isinstance(content, str) else content


def _q(text: str) -> str:
    return urllib.request.quote(text, safe="")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ours(airflow_home: Path) -> list[int]:
    """Processes whose environment names this test's AIRFLOW_HOME: what the server started,
    including any that left its process group."""
    mark = f"AIRFLOW_HOME={airflow_home}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _stop(proc: subprocess.Popen[bytes], airflow_home: Path) -> None:
    """SIGTERM the server's process group, give it 30 s, then SIGKILL what is left."""
    for sig, grace_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        for pid in _ours(airflow_home):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (proc.poll() is None or _alive(airflow_home)):
            time.sleep(0.5)
        if proc.poll() is not None and not _alive(airflow_home):
            return


def _alive(airflow_home: Path) -> bool:
    for pid in _ours(airflow_home):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            return True
    return False


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("standalone")
    home, airflow_home = root / "home", root / "airflow"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "HELIOTROPE"))}
    env.update(
        {
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
            "AIRFLOW_HOME": str(airflow_home),
            "AIRFLOW__API__PORT": str(port),
            # No login for the test (and Chromium): every request is an admin's.
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            # Only what the test unpauses runs: no signals polls, no rebalance ticks.
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            # Heliotrope's home through the Airflow Variable, as an operator would set it.
            "AIRFLOW_VAR_HELIOTROPE": json.dumps({"home": str(home)}),
        }
    )
    log = root / "standalone.log"
    srv = Server(url=f"http://127.0.0.1:{port}", home=home, airflow_home=airflow_home, log=log)
    srv.started_s = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", str(REPO / "infra" / "airflow" / "standalone.sh")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=root,
        )
    try:
        _wait_healthy(srv, proc)
        yield srv
    finally:
        stop_instances(home)  # the job processes the tasks launched (their own sessions)
        _stop(proc, airflow_home)
        assert not _alive(airflow_home), "the standalone server left processes behind"
        print(
            f"\nstandalone: healthy after {srv.healthy_after_s:.0f} s, whole module "
            f"{time.monotonic() - srv.started_s:.0f} s; log {log}"
        )


def _wait_healthy(srv: Server, proc: subprocess.Popen[bytes], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"airflow standalone exited; see {srv.log}"
        assert time.monotonic() < deadline, f"not healthy in {timeout_s:.0f} s; see {srv.log}"
        try:
            health = srv.call("GET", "/api/v2/monitor/health")
            up = all(
                health.get(c, {}).get("status") == "healthy"
                for c in ("metadatabase", "scheduler", "dag_processor", "triggerer")
            )
            if up:
                srv.token = srv.call("GET", "/auth/token")["access_token"]
                dags = srv.call("GET", "/api/v2/dags?limit=100")["dags"]
                if {d["dag_id"] for d in dags} >= set(DAG_IDS):
                    srv.healthy_after_s = time.monotonic() - srv.started_s
                    return
        except (urllib.error.URLError, ConnectionError, OSError, KeyError):
            pass
        time.sleep(2.0)


def test_migrate_and_replay_through_the_rest_api(server: Server, tmp_path: Path) -> None:
    from orchestrator.live.commands import jobs_table, submit
    from orchestrator.live.world import local_world

    os.environ["HELIOTROPE_HOME"] = str(server.home)  # for the checks made from here
    try:
        assert submit(write_jobs(tmp_path / "jobs.yaml", sleep_s=300)) == ["lm"]
        store = local_world().open_store()
        assert server.call("GET", "/api/v2/importErrors")["total_entries"] == 0
        for dag_id in ("heliotrope_migrate", "heliotrope_replay"):
            server.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

        from tests.dags.test_task_bodies import replay_jobs

        replay_conf = {
            "jobs_file": str(replay_jobs(tmp_path / "replay.yaml")),
            "window_start": "2024-04-01T00:00:00Z",
            "window_days": 1.5,
            "policies": ["on-demand", "carbon-greedy"],
        }
        replay_run = server.trigger("heliotrope_replay", replay_conf)

        t0 = time.monotonic()
        dry = server.trigger("heliotrope_migrate", {"job": "lm", "region": "europe-west4"})
        assert server.wait("heliotrope_migrate", dry) == "success"
        per_run_s = time.monotonic() - t0
        plan = server.xcom("heliotrope_migrate", dry, "migrate")
        assert plan["started"] is False and plan["to"].startswith("gcp:europe-west4")
        assert jobs_table(store)[0]["phase"] == "pending", "a dry run (the default) changes nothing"

        placed = server.trigger(
            "heliotrope_migrate", {"job": "lm", "region": "europe-west4", "dry_run": False}
        )
        assert server.wait("heliotrope_migrate", placed) == "success"
        assert server.xcom("heliotrope_migrate", placed, "migrate")["started"] is True
        assert jobs_table(store)[0]["where"].startswith("gcp:europe-west4")

        moved = server.trigger(
            "heliotrope_migrate",
            {"job": "lm", "region": "us-east-1", "market": "on_demand", "dry_run": False},
        )
        assert server.wait("heliotrope_migrate", moved) == "success"
        (move,) = store.open_migrations("lm")
        assert move.src_offer_id.startswith("gcp:europe-west4")
        assert move.dst_offer_id == "aws:us-east-1a:g6.xlarge:on_demand"

        # A second move while the first is under way: the CLI's refusal, and the run fails.
        refused = server.trigger("heliotrope_migrate", {"job": "lm", "region": "eu-north-1"})
        assert server.wait("heliotrope_migrate", refused) == "failed"
        log = server.task_log("heliotrope_migrate", refused, "migrate")
        assert "expected a job with no migration in progress, got lm is being migrated" in log

        assert server.wait("heliotrope_replay", replay_run) == "success"
        report = server.xcom("heliotrope_replay", replay_run, "replay")["report"]
        assert Path(report).is_file() and Path(report).is_relative_to(server.home)
        assert f"replay report: {report}" in server.task_log(
            "heliotrope_replay", replay_run, "replay"
        )
        print(f"\nstandalone: one migrate run, trigger to success: {per_run_s:.1f} s")
    finally:
        os.environ.pop("HELIOTROPE_HOME", None)


def test_a_screenshot_of_the_dag_list(server: Server, tmp_path: Path) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(
            "no Chromium at /usr/bin/chromium: install Debian's package "
            "(`apt-get install -y chromium`) for the DAG-list screenshot"
        )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "airflow-dag-list.png"
    shot.unlink(missing_ok=True)
    flags = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium'}",
        "--window-size=1600,1000",
        "--virtual-time-budget=20000",
    ]
    url = f"{server.url}/dags"
    dom = subprocess.run(
        [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True
    ).stdout
    for dag_id in DAG_IDS:
        assert dag_id in dom, f"{dag_id} is not on the DAG list page"
    subprocess.run(
        [*flags, f"--screenshot={shot}", url], capture_output=True, timeout=180, check=True
    )
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    print(f"\nDAG list screenshot: {shot}")
