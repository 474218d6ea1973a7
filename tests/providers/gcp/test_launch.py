"""launch(): what the insert carries, idempotency, and every error as a FailureKind."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from providers.base import FailureKind
from providers.gcp import GcpLaunchConfig, naming

from .conftest import CLUSTER, OD_A100, PROJECT, SPOT_A100, T0, ZONE, Factory, spec
from .fake_compute import FakeCompute, recorded

INSERT = "compute.instances.insert"


def metadata(body: dict[str, Any]) -> dict[str, str]:
    return {item["key"]: item["value"] for item in body["metadata"]["items"]}


def test_spot_insert_carries_spot_scheduling_labels_and_derived_request_id(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    outcome = provider.launch(spec(job="Job #7/A"), request_id="req-1")

    assert outcome.ok and outcome.error is None
    [insert] = compute.requests_for(INSERT)
    body = insert.body
    gang = naming.gang_for(project=PROJECT, cluster=CLUSTER, request_id="req-1", zone=ZONE, count=1)
    assert outcome.instance_id == f"{ZONE}/{gang.name}" == gang.instance_id
    assert body["name"] == gang.name
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/a2-highgpu-1g"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["labels"] == {
        "heliotrope-cluster": "ml-prod",
        "heliotrope-job": naming.label_value("Job #7/A"),
        "heliotrope-request": "req-1",
        "heliotrope-gang": gang.name,
    }
    for value in body["labels"].values():  # Compute Engine's label rules
        assert len(value) <= 63 and set(value) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_")
    request_id = insert.query["requestId"][0]
    assert uuid.UUID(request_id).version == 5
    assert request_id == naming.request_uuid(PROJECT, ZONE, gang.name, "insert")
    meta = metadata(body)
    assert meta["heliotrope-cluster"] == CLUSTER and meta["heliotrope-job-id"] == "Job #7/A"
    assert meta["heliotrope-request-id"] == "req-1"
    assert "python train.py" in meta["startup-script"]
    assert "export HELIOTROPE_NOTICE_SOURCE=gcp" in meta["startup-script"]
    disk = body["disks"][0]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == GcpLaunchConfig().boot_image
    assert "accessConfigs" not in body["networkInterfaces"][0]  # no public address
    # it waited for the zone operation before answering
    assert [c.api for c in compute.calls] == [
        "compute.instances.get",
        INSERT,
        "compute.zoneOperations.wait",
    ]


def test_on_demand_insert_is_standard_and_restarts(
    make_provider: Factory, compute: FakeCompute
) -> None:
    assert make_provider().launch(spec(OD_A100), request_id="req-od").ok
    [insert] = compute.requests_for(INSERT)
    assert insert.body["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
    }
    assert "HELIOTROPE_NOTICE_SOURCE" not in metadata(insert.body)["startup-script"]


def test_boot_image_and_network_come_from_config(
    make_provider: Factory, compute: FakeCompute
) -> None:
    config = GcpLaunchConfig(
        boot_image="projects/acme/global/images/trainer-v3",
        boot_disk_gb=500,
        subnetwork="regions/us-central1/subnetworks/gpu",
        entrypoint=("/opt/trainer/run",),
    )
    make_provider(launch_config=config).launch(spec(entrypoint=()), request_id="req-cfg")
    [insert] = compute.requests_for(INSERT)
    params = insert.body["disks"][0]["initializeParams"]
    assert params["sourceImage"] == "projects/acme/global/images/trainer-v3"
    assert params["diskSizeGb"] == "500"
    nic = insert.body["networkInterfaces"][0]
    assert nic["subnetwork"] == "regions/us-central1/subnetworks/gpu"
    assert "/opt/trainer/run" in metadata(insert.body)["startup-script"]


def test_a_retried_launch_creates_one_instance(
    make_provider: Factory, compute: FakeCompute
) -> None:
    first = make_provider().launch(spec(), request_id="req-1")
    again = make_provider().launch(spec(), request_id="req-1")  # e.g. after a restart
    assert first.ok and again.ok and again.instance_id == first.instance_id
    assert len(compute.requests_for(INSERT)) == 1
    assert len(compute.instances) == 1
    other = make_provider().launch(spec(), request_id="req-2")
    assert other.instance_id != first.instance_id and len(compute.instances) == 2


def test_throttled_insert_is_retried_with_the_same_request_id(
    make_provider: Factory, compute: FakeCompute, sleeps: list[float]
) -> None:
    compute.script(
        INSERT,
        (429, recorded("error_429_rate_limit.json")),
        (503, recorded("error_503_backend.json")),
    )
    outcome = make_provider().launch(spec(), request_id="req-1")
    assert outcome.ok
    inserts = compute.requests_for(INSERT)
    assert len(inserts) == 3
    assert len({c.query["requestId"][0] for c in inserts}) == 1
    assert len(compute.instances) == 1
    assert len(sleeps) == 2 and all(s > 0 for s in sleeps)  # backed off through the injected sleep


def test_throttling_that_does_not_end_is_transient(
    make_provider: Factory, compute: FakeCompute, sleeps: list[float]
) -> None:
    compute.script(INSERT, *[(429, recorded("error_429_rate_limit.json"))] * 3)
    outcome = make_provider(max_attempts=3).launch(spec(), request_id="req-1")
    assert not outcome.ok and outcome.error is not None
    assert outcome.error.kind is FailureKind.TRANSIENT and outcome.error.retry_after_s > 0
    assert len(compute.requests_for(INSERT)) == 3 and len(sleeps) == 2


HTTP_ERRORS = [
    # (status, recorded body, expected kind)
    (403, "error_403_permission_denied.json", FailureKind.AUTH),
    (403, "error_403_quota_exceeded.json", FailureKind.QUOTA),
    (400, "error_400_invalid.json", FailureKind.INVALID),
]


@pytest.mark.parametrize(("status", "fixture", "kind"), HTTP_ERRORS)
def test_http_errors_map_to_failure_kinds(
    make_provider: Factory,
    compute: FakeCompute,
    sleeps: list[float],
    status: int,
    fixture: str,
    kind: FailureKind,
) -> None:
    body = recorded(fixture, project=PROJECT, zone=ZONE, instance="x")
    compute.script(INSERT, (status, body))
    outcome = make_provider().launch(spec(), request_id="req-1")
    assert outcome.instance_id is None and outcome.error is not None
    assert outcome.error.kind is kind
    assert body["error"]["message"] in outcome.error.message
    assert len(compute.requests_for(INSERT)) == 1 and sleeps == []  # not retried
    assert compute.instances == {}


OPERATION_ERRORS = [
    (
        "operation_zone_resource_pool_exhausted.json",
        FailureKind.CAPACITY,
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    ),
    (
        "operation_zone_resource_pool_exhausted_with_details.json",
        FailureKind.CAPACITY,
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    ),
    ("operation_quota_exceeded.json", FailureKind.QUOTA, "QUOTA_EXCEEDED"),
]


@pytest.mark.parametrize(("fixture", "kind", "code"), OPERATION_ERRORS)
def test_operations_that_finish_with_errors_map_to_failure_kinds(
    make_provider: Factory, compute: FakeCompute, fixture: str, kind: FailureKind, code: str
) -> None:
    compute.failing_inserts.append(fixture)
    outcome = make_provider().launch(spec(), request_id="req-1")
    assert outcome.instance_id is None and outcome.error is not None
    assert outcome.error.kind is kind and code in outcome.error.message
    assert compute.instances == {}
    assert compute.requests_for("compute.zoneOperations.wait")


def test_a_gang_is_launched_together_and_rolled_back_together(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    ok = provider.launch(spec(count=2), request_id="gang-ok")
    assert ok.ok
    gang = naming.parse_instance_id(ok.instance_id or "")
    assert gang is not None and gang.count == 2
    bodies = [c.body for c in compute.requests_for(INSERT)]
    assert [b["name"] for b in bodies] == list(gang.members)
    scripts = [metadata(b)["startup-script"] for b in bodies]
    assert "export HELIOTROPE_NODE_RANK=0" in scripts[0]
    assert "export HELIOTROPE_NODE_RANK=1" in scripts[1]
    assert all("export HELIOTROPE_NUM_NODES=2" in s for s in scripts)
    assert all(
        f"HELIOTROPE_MASTER_ADDR={gang.members[0]}.{ZONE}.c.{PROJECT}.internal" in s
        for s in scripts
    )

    # second member hits a stockout: the first is deleted again, nothing is left billing
    compute.failing_inserts.extend([None, "operation_zone_resource_pool_exhausted.json"])
    before = set(compute.instances)
    failed = provider.launch(spec(count=2), request_id="gang-stockout")
    assert failed.error is not None and failed.error.kind is FailureKind.CAPACITY
    assert set(compute.instances) == before
    deleted = [c.path.rsplit("/", 1)[-1] for c in compute.requests_for("compute.instances.delete")]
    failed_gang = naming.gang_for(
        project=PROJECT, cluster=CLUSTER, request_id="gang-stockout", zone=ZONE, count=2
    )
    assert deleted == [failed_gang.members[0]]


def test_an_instance_with_our_name_that_is_not_ours_is_left_alone(
    make_provider: Factory, compute: FakeCompute
) -> None:
    gang = naming.gang_for(project=PROJECT, cluster=CLUSTER, request_id="req-1", zone=ZONE, count=1)
    compute.add_instance(ZONE, "instance_other_cluster.json", gang.name)
    outcome = make_provider().launch(spec(), request_id="req-1")
    assert outcome.error is not None and outcome.error.kind is FailureKind.INVALID
    assert not compute.requests_for(INSERT)
    assert not compute.requests_for("compute.instances.delete")


@pytest.mark.parametrize(
    "env",
    [
        {"WANDB_API_KEY": "k"},
        {"HF_TOKEN": "t"},
        {"AWS_SECRET_ACCESS_KEY": "s"},
        {"GOOGLE_APPLICATION_CREDENTIALS": "/k.json"},
        {"DB_PASSWORD": "p"},
        {"GITHUB_AUTH_TOKEN": "t"},
        {"SSH_PRIVATE_KEY": "k"},
        {"NOT A NAME": "x"},
    ],
)
def test_secrets_never_reach_metadata(
    make_provider: Factory, compute: FakeCompute, env: dict[str, str]
) -> None:
    outcome = make_provider().launch(spec(env=env), request_id="req-1")
    assert outcome.error is not None and outcome.error.kind is FailureKind.INVALID
    assert compute.calls == []


@pytest.mark.parametrize(
    ("offer", "cluster", "count"),
    [
        ("aws:us-east-1a:p3.2xlarge:spot", CLUSTER, 1),
        ("gcp:asia-east1-a:a2-highgpu-1g:spot", CLUSTER, 1),  # not one of our zones
        ("gcp:us-central1-a:n1-standard-8:spot", CLUSTER, 1),  # no GPU
        ("gcp:us-central1-a:a2-highgpu-1g:reserved", CLUSTER, 1),
        (SPOT_A100, "someone-else", 1),
        (SPOT_A100, CLUSTER, 0),
    ],
)
def test_bad_offers_are_invalid_and_send_nothing(
    make_provider: Factory, compute: FakeCompute, offer: str, cluster: str, count: int
) -> None:
    outcome = make_provider().launch(spec(offer, cluster=cluster, count=count), request_id="req-1")
    assert outcome.error is not None and outcome.error.kind is FailureKind.INVALID
    assert compute.calls == []


def test_ordinary_names_that_contain_secret_words_are_fine(
    make_provider: Factory, compute: FakeCompute
) -> None:
    env = {"TOKENIZERS_PARALLELISM": "false", "NCCL_SOCKET_IFNAME": "ens", "AUTHOR": "me"}
    assert make_provider().launch(spec(env=env), request_id="req-1").ok
    script = metadata(compute.requests_for(INSERT)[0].body)["startup-script"]
    assert "export TOKENIZERS_PARALLELISM=false" in script


def test_startup_script_exports_the_environment_verbatim(tmp_path: Path) -> None:
    env = {"HELIOTROPE_JOB_ID": "job 1", "TRICKY": 'it\'s $HOME; `rm -rf /` "q"\nline2'}
    script = naming.startup_script(env, ("python", "-c", "print('hi')"))
    # take the job.env the script writes and source it in a real shell
    marker = script.split("<<'", 1)[1].split("'", 1)[0]
    body = script.split(f"<<'{marker}'\n", 1)[1].split(f"\n{marker}\n", 1)[0]
    env_file = tmp_path / "job.env"
    env_file.write_text(body + "\n")
    out = subprocess.run(
        ["bash", "-c", f'. "{env_file}"; printf "%s|%s" "$HELIOTROPE_JOB_ID" "$TRICKY"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == f"{env['HELIOTROPE_JOB_ID']}|{env['TRICKY']}"
    assert "setsid nohup python -c 'print('\"'\"'hi'\"'\"')'" in script
    with pytest.raises(ValueError, match="API_KEY"):
        naming.startup_script({"API_KEY": "x"}, ())


def test_an_operation_that_never_finishes_is_transient_and_undone(
    make_provider: Factory, compute: FakeCompute
) -> None:
    clock = FakeClock(T0)
    running = recorded(
        "operation_insert_running.json",
        project=PROJECT,
        zone=ZONE,
        instance="x",
        operation="operation-stuck",
        operation_id=1,
        target_id=2,
        time="2024-05-01T10:00:00.000-07:00",
    )
    compute.script("compute.zoneOperations.wait", *[(200, running)] * 50)
    config = GcpLaunchConfig(operation_timeout_s=10.0, poll_interval_s=2.0)
    provider = make_provider(clock=clock, sleep=clock.sleep, launch_config=config)
    outcome = provider.launch(spec(), request_id="req-1")
    assert outcome.error is not None and outcome.error.kind is FailureKind.TRANSIENT
    assert "not done after 10 s" in outcome.error.message
    assert len(compute.requests_for("compute.zoneOperations.wait")) == 5
    assert compute.instances == {}  # what the stuck insert made was deleted again
    assert len(compute.requests_for("compute.instances.delete")) == 1


def test_a_value_holding_the_heredoc_end_never_breaks_out(tmp_path: Path) -> None:
    """A value with a newline and an end-marker-looking line stays a value: running the
    script's env-writing part in a real shell writes the value, executes nothing."""
    canary = tmp_path / "ran"
    env = {"EVIL": f"x\nHELIOTROPE_ENV\ntouch {canary}\nHELIOTROPE_ENV_"}
    script = naming.startup_script(env, ())
    runnable = script.replace("/var/lib/heliotrope", str(tmp_path / "lib"))
    subprocess.run(["bash", "-c", runnable], check=True, capture_output=True)
    assert not canary.exists()
    out = subprocess.run(
        ["bash", "-c", f'. "{tmp_path}/lib/job.env"; printf %s "$EVIL"'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == env["EVIL"]
