"""The deployment in infra/airflow/ against what the code expects: the Docker Compose file
(CeleryExecutor, two workers), the Helm values (KubernetesExecutor) and the Dockerfile both
use. Parsed and cross-checked here; `docker compose config` runs too when a Docker engine
answers on this machine."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from orchestrator.state.sql import ENV_VAR, resolve_url

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra" / "airflow"
COMPOSE = INFRA / "docker-compose.yaml"
HELM = INFRA / "helm-values.yaml"
DOCKERFILE = INFRA / "Dockerfile"
DAGS_IN_IMAGE = "/opt/airflow/dags"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _airflow_pin() -> str:
    extra = _pyproject()["project"]["optional-dependencies"]["airflow"]
    pins = [m.group(1) for dep in extra if (m := re.fullmatch(r"apache-airflow==([\w.]+)", dep))]
    assert len(pins) == 1, extra
    return pins[0]


def _version() -> str:
    return str(_pyproject()["project"]["version"])


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _helm() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(HELM.read_text())
    return data


def _dockerfile() -> list[str]:
    """Instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def _instr(name: str) -> list[str]:
    return [ln[len(name) + 1 :] for ln in _dockerfile() if ln.upper().startswith(name + " ")]


def _env_default(value: str) -> str:
    """`${VAR:-default}` -> default (what compose uses when VAR is unset)."""
    match = re.fullmatch(r"\$\{\w+:-([^}]*)\}", value)
    return match.group(1) if match else value


def _docker_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for line in _instr("ENV"):
        env.update(dict(re.findall(r"(\w+)=(\S+)", line)))
    return env


def _airflow_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n.startswith("airflow-")}


def _command(service: dict[str, Any]) -> str:
    cmd = service.get("command", "")
    return cmd if isinstance(cmd, str) else " ".join(cmd)


# -- the Dockerfile --------------------------------------------------------------------------


def test_dockerfile_builds_heliotrope_on_the_pinned_airflow() -> None:
    assert _instr("FROM") == [f"apache/airflow:{_airflow_pin()}"]
    (run,) = [r for r in _instr("RUN") if "pip install" in r]
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in run  # installing never moves Airflow
    assert '".[aws,gcp]"' in run
    copied = {c.split()[-2].rstrip("/"): c.split()[-1] for c in _instr("COPY")}
    project = _pyproject()
    for pkg in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pkg.rstrip("*") in copied, f"{pkg} is not copied into the image"
    assert {"pyproject.toml", "README.md"} <= {w for c in _instr("COPY") for w in c.split()}
    assert project["project"]["readme"] == "README.md"
    assert copied["dags"] == DAGS_IN_IMAGE
    assert sorted(p.name for p in (REPO / "dags").glob("heliotrope_*.py"))  # what it copies
    label = " ".join(_instr("LABEL"))
    assert 'org.opencontainers.image.title="heliotrope-airflow"' in label
    assert f'org.opencontainers.image.version="{_version()}"' in label
    env = _docker_env()
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == DAGS_IN_IMAGE
    assert env["HELIOTROPE_HOME"] == "/opt/airflow/heliotrope"


# -- Docker Compose: CeleryExecutor ---------------------------------------------------------


def test_compose_runs_every_airflow_3_component_and_two_workers() -> None:
    compose = _compose()
    services = compose["services"]
    airflow = _airflow_services(compose)
    commands = {n: _command(s) for n, s in airflow.items()}
    for component in ("api-server", "scheduler", "dag-processor", "triggerer"):
        assert component in commands.values(), f"no service runs `airflow {component}`"
    workers = {n: c for n, c in commands.items() if c.startswith("celery worker")}
    assert len(workers) == 2, workers
    names = {re.search(r"--celery-hostname (\S+)", c).group(1) for c in workers.values()}  # type: ignore[union-attr]
    assert len(names) == 2, "the two workers need distinct Celery node names"
    assert {"postgres", "redis"} <= set(services)
    for name in (*workers, "airflow-scheduler", "airflow-apiserver"):
        deps = airflow[name]["depends_on"]
        assert deps["airflow-init"]["condition"] == "service_completed_successfully"
        assert deps["postgres"]["condition"] == deps["redis"]["condition"] == "service_healthy"
    init = _command(airflow["airflow-init"])
    assert "airflow db migrate" in init
    assert "from orchestrator.state import upgrade; upgrade()" in init  # Heliotrope's schema


def test_compose_settings_match_what_the_code_expects() -> None:
    compose = _compose()
    airflow = _airflow_services(compose)
    envs = [s["environment"] for s in airflow.values()]
    assert all(e == envs[0] or {**envs[0], **e} == e for e in envs)  # workers only add
    env = envs[0]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    meta = urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert meta.scheme.startswith("postgresql") and meta.hostname == "postgres"
    assert meta.path == "/airflow"
    pg = compose["services"]["postgres"]["environment"]
    assert (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]) == (
        meta.username,
        meta.password,
        "airflow",
    )
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql://")
    broker = urlsplit(env["AIRFLOW__CELERY__BROKER_URL"])
    assert (broker.scheme, broker.hostname, broker.port) == ("redis", "redis", 6379)
    api = urlsplit(env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert api.hostname == "airflow-apiserver" and api.path == "/execution/"
    assert f"{api.port}:{api.port}" in airflow["airflow-apiserver"]["ports"]
    # The same JWT secret in every component: tasks authenticate to the API server with it.
    assert len({e["AIRFLOW__API_AUTH__JWT_SECRET"] for e in envs}) == 1
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == DAGS_IN_IMAGE
    # Heliotrope's state store: the variable the code reads, a database the init creates.
    assert ENV_VAR == "HELIOTROPE_DB_URL"
    state = resolve_url(env[ENV_VAR])
    assert state.drivername == "postgresql+psycopg" and state.host == "postgres"
    init_sql = compose["configs"]["heliotrope-database"]["content"]
    assert re.search(rf"CREATE DATABASE {state.database}\b", init_sql)
    mounts = {v.split(":")[1] for v in compose["x-airflow-common"]["volumes"]}
    assert env["HELIOTROPE_HOME"] == _docker_env()["HELIOTROPE_HOME"]
    assert env["HELIOTROPE_HOME"] in mounts
    for name, service in airflow.items():
        assert {v.split(":")[1] for v in service["volumes"]} >= {env["HELIOTROPE_HOME"]}, name


def test_compose_image_is_the_dockerfile_image() -> None:
    compose = _compose()
    images = {s["image"] for s in _airflow_services(compose).values()}
    assert len(images) == 1
    image = _env_default(images.pop())
    assert image == f"heliotrope-airflow:{_version()}"
    build = compose["x-airflow-common"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert context == REPO
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE


# -- Helm: KubernetesExecutor ----------------------------------------------------------------


def test_helm_values_match_the_image_and_the_code() -> None:
    helm, compose = _helm(), _compose()
    assert helm["executor"] == "KubernetesExecutor"
    assert helm["airflowVersion"] == helm["defaultAirflowTag"] == _airflow_pin()
    repo, tag = _env_default(compose["x-airflow-common"]["image"]).split(":")
    assert (helm["images"]["airflow"]["repository"], helm["images"]["airflow"]["tag"]) == (
        repo,
        tag,
    )
    # DAGs from the image: no git-sync, no DAG volume, the folder the Dockerfile fills.
    assert helm["dags"]["gitSync"]["enabled"] is False
    assert helm["dags"]["persistence"]["enabled"] is False
    assert helm["config"]["core"]["dags_folder"] == DAGS_IN_IMAGE
    assert helm["redis"]["enabled"] is False  # no Celery broker with this executor
    assert helm["data"]["metadataSecretName"]
    secrets = {s["envName"]: s for s in helm["secret"]}
    assert secrets[ENV_VAR]["secretName"] and secrets[ENV_VAR]["secretKey"]
    env = {e["name"]: e["value"] for e in helm["env"]}
    assert env["HELIOTROPE_HOME"] == _docker_env()["HELIOTROPE_HOME"]
    mounts = {m["name"]: m["mountPath"] for m in helm["volumeMounts"]}
    assert env["HELIOTROPE_HOME"] in mounts.values()
    assert set(mounts) <= {v["name"] for v in helm["volumes"]}
    assert helm["jwtSecretName"] and helm["apiSecretKeySecretName"]
    assert helm["dagProcessor"]["enabled"] is True


def test_celery_executor_class_exists_when_the_provider_is_installed() -> None:
    pytest.importorskip(
        "airflow.providers.celery", reason="apache-airflow-providers-celery is not installed"
    )
    from airflow.providers.celery.executors.celery_executor import CeleryExecutor

    assert (
        CeleryExecutor.__name__
        == _compose()["x-airflow-common"]["environment"]["AIRFLOW__CORE__EXECUTOR"]
    )


def _docker_engine() -> str | None:
    """Why `docker compose` cannot run here, or None when an engine answers."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on this machine"
    try:
        info = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        return "docker info timed out: no engine answers"
    if info.returncode != 0:
        return f"no Docker engine answers: {(info.stderr or info.stdout).strip()[:200]}"
    return None


def test_docker_compose_config_validates() -> None:
    reason = _docker_engine()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "AIRFLOW_JWT_SECRET": "test", "AIRFLOW_API_SECRET_KEY": "test"}
    done = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
