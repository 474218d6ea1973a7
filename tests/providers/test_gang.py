"""The gang launch contract (providers/gang.py) on every provider, read from what each one
puts on the node: the AWS user data and the GCP and Azure startup scripts are run by a real
bash (with a fake IMDS `curl` and a fake `torchrun` that writes down its environment and
arguments), the Kubernetes pod spec is read from the fake API server, and the local
provider's process is started for real (its torchrun is the same fake).

Each cloud is faked at its API: moto for AWS, the recorded-response fakes of the GCP, Azure
and Kubernetes suites (tests/providers/conftest.py starts them).
"""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from providers import gang
from providers.aws import TAG_CLUSTER, AwsProvider
from providers.aws.instances import AwsInstance, parse_instance
from providers.aws.userdata import LOG_DIR
from providers.base import Capability, ComputeProvider, EventType, FailureKind, LaunchSpec
from providers.gcp import naming
from tests.providers.aws.conftest import AwsError
from tests.providers.conftest import CLUSTER, CloudFakes, NewCloudFakes

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ENTRYPOINT = ("python", "train.py", "--resume")
FAKE_CURL = """#!/bin/sh
for a; do case "$a" in http*) url=$a ;; esac; done
case "$url" in
  */api/token) printf tok ;;
  */meta-data/*) cat "$FAKE_IMDS/${url##*/meta-data/}" ;;
  *) exit 22 ;;
esac
"""
FAKE_TORCHRUN = """#!/bin/sh
env -0 > "$NODE_OUT/env.tmp" && mv "$NODE_OUT/env.tmp" "$NODE_OUT/env"
printf '%s\\0' "$@" > "$NODE_OUT/argv.tmp" && mv "$NODE_OUT/argv.tmp" "$NODE_OUT/argv"
"""

Node = tuple[dict[str, str], list[str]]  # what a node got: (environment, torchrun's arguments)


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def read_node(out: Path) -> Node:
    deadline = time.monotonic() + 20
    while not (out / "argv").exists() or not (out / "env").exists():
        assert time.monotonic() < deadline, f"the node's job did not start ({out})"
        time.sleep(0.02)
    env = dict(e.split("=", 1) for e in (out / "env").read_text().split("\0") if "=" in e)
    return env, (out / "argv").read_text().split("\0")[:-1]


def run_script(script: str, out: Path, bin_dir: Path, imds: dict[str, str] | None = None) -> Node:
    """Run a boot script as the node would (its paths moved under `out`), with the fake
    `torchrun` and IMDS on PATH; what torchrun got."""
    out.mkdir(parents=True)
    for old, new in (
        (LOG_DIR, out / "log"),
        (naming.JOB_LOG, out / "job.log"),
        (naming.JOB_DIR, out / "job"),
    ):
        script = script.replace(old, str(new))
    fake_imds = out / "imds"
    fake_imds.mkdir()
    for name, value in (imds or {}).items():
        (fake_imds / name).write_text(value)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NODE_OUT": str(out),
        "FAKE_IMDS": str(fake_imds),
    }
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)
    return read_node(out)


@dataclass
class Rig:
    """One provider with its fake, and the test's ways into the fake."""

    provider: ComputeProvider
    offer: str
    nnodes: int  # nodes a gang of `COUNT` runs on (a local gang is one node)
    nproc: int  # processes on each
    nodes: Callable[[str], list[Node]]  # what each node of a request got, rank order
    master: Callable[[str], str]  # the MASTER_ADDR every node of a launched gang must get
    live: Callable[[], int]  # instances (VMs, pods, processes) of ours that are up
    fail_last: Callable[[], None]  # the next gang's last node cannot be launched
    preempt_last: Callable[[str], None]  # the cloud takes a launched gang's last node
    extra: int = 0  # what `live` counts besides the nodes of a gang (Kubernetes: its Service)


COUNT = 3
LOCAL_OFFER = "local:west:local-cpu:on_demand"


def aws_rig(fakes: CloudFakes, tmp: Path, bin_dir: Path) -> Rig:
    provider = AwsProvider(
        cluster=CLUSTER,
        regions=("us-east-1", "us-west-2"),
        session_factory=fakes.aws_session,
        clock=FakeClock(T0),
        sleep=lambda s: None,
    )
    ec2 = fakes.raw.client("ec2")

    def ours() -> list[AwsInstance]:
        answer = ec2.describe_instances(
            Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [CLUSTER]}]
        )
        found = [
            parse_instance(i, "us-east-1") for r in answer["Reservations"] for i in r["Instances"]
        ]
        return sorted((m for m in found if m.live), key=lambda m: m.rank)

    def nodes(request_id: str) -> list[Node]:
        got = []
        for m in (m for m in ours() if m.request_id == request_id):
            raw = ec2.describe_instance_attribute(InstanceId=m.id, Attribute="userData")
            script = base64.b64decode(raw["UserData"]["Value"]).decode()
            imds = {
                "instance-id": m.id,
                "local-ipv4": m.private_ip,
                "ami-launch-index": str(m.launch_index),
            }
            got.append(run_script(script, tmp / "aws" / m.id, bin_dir, imds))
        return got

    def master(request_id: str) -> str:
        return next(m.private_ip for m in ours() if m.request_id == request_id and m.rank == 0)

    def fail_last() -> None:
        calls = [0]

        def second_call_fails(params: dict[str, Any]) -> AwsError | None:
            calls[0] += 1  # rank 0 goes through; the call for ranks 1..N-1 finds no capacity
            return AwsError("InsufficientInstanceCapacity") if calls[0] == 2 else None

        fakes.hooks.on("ec2:RunInstances", second_call_fails)

    def preempt_last(request_id: str) -> None:
        last = [m for m in ours() if m.request_id == request_id][-1]
        ec2.terminate_instances(InstanceIds=[last.id])

    return Rig(
        provider,
        "aws:us-east-1a:p4d.24xlarge:on_demand",
        COUNT,
        8,
        nodes,
        master,
        lambda: len(ours()),
        fail_last,
        preempt_last,
    )


def gcp_rig(fakes: CloudFakes, tmp: Path, bin_dir: Path) -> Rig:
    from google.auth.credentials import AnonymousCredentials

    from providers.gcp import GcpProvider

    compute = fakes.compute
    provider = GcpProvider(
        cluster=CLUSTER,
        project=compute.project,
        zones=("us-central1-a",),
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": compute.url},
        clock=FakeClock(T0),
        sleep=lambda s: None,
        billing_endpoint=compute.url,
    )

    def nodes(request_id: str) -> list[Node]:
        got = []
        for call in compute.requests_for("compute.instances.insert"):
            items = {i["key"]: i["value"] for i in call.body["metadata"]["items"]}
            if items[naming.META_REQUEST] == request_id:
                out = tmp / "gcp" / call.body["name"]
                got.append(run_script(items[naming.META_STARTUP_SCRIPT], out, bin_dir))
        return got

    def members(request_id: str) -> naming.Gang:
        return naming.gang_for(
            project=compute.project,
            cluster=CLUSTER,
            request_id=request_id,
            zone="us-central1-a",
            count=COUNT,
        )

    def master(request_id: str) -> str:
        return f"{members(request_id).members[0]}.us-central1-a.c.{compute.project}.internal"

    def fail_last() -> None:
        compute.failing_inserts.extend([None] * (COUNT - 1))
        compute.failing_inserts.append("operation_zone_resource_pool_exhausted.json")

    return Rig(
        provider,
        "gcp:us-central1-a:a2-highgpu-2g:spot",
        COUNT,
        2,
        nodes,
        master,
        lambda: len(compute.instances),
        fail_last,
        lambda request_id: compute.preempt("us-central1-a", members(request_id).members[-1]),
    )


def azure_rig(fakes: NewCloudFakes, tmp: Path, bin_dir: Path) -> Rig:
    from providers.azure import AzureProvider
    from providers.azure.provider import TAG_REQUEST as TAG_REQUEST_AZURE
    from tests.providers.azure.fake_arm import FakeCredential
    from tests.providers.azure.support import CONFIG, REGIONS, RESOURCE_GROUP, SUBSCRIPTION

    arm = fakes.arm
    provider = AzureProvider(
        cluster=CLUSTER,
        subscription_id=SUBSCRIPTION,
        resource_group=RESOURCE_GROUP,
        regions=REGIONS,
        credential=FakeCredential(),
        transport=arm.transport(),
        launch_config=CONFIG,
        clock=FakeClock(T0),
        sleep=lambda s: None,
        prices_endpoint=arm.url,
    )

    def nodes(request_id: str) -> list[Node]:
        got = []
        for call in arm.requests_for("PUT", "Microsoft.Compute/virtualMachines/write"):
            if call.body["tags"][TAG_REQUEST_AZURE] != request_id:
                continue
            data = call.body["properties"]["osProfile"]["customData"]
            name = call.path.rsplit("/", 1)[-1]
            got.append(run_script(base64.b64decode(data).decode(), tmp / "az" / name, bin_dir))
        return got

    def member_names(request_id: str) -> tuple[str, ...]:
        gang_of = naming.gang_for(
            project=f"{SUBSCRIPTION}/{RESOURCE_GROUP}",
            cluster=CLUSTER,
            request_id=request_id,
            zone="swedencentral",
            count=COUNT,
        )
        return gang_of.members

    def fail_last() -> None:
        arm.failing_creates.extend([None] * (COUNT - 1))
        arm.failing_creates.append("error_allocation_failed.json")

    return Rig(
        provider,
        "azure:swedencentral:Standard_ND96isr_H100_v5:spot",
        COUNT,
        8,
        nodes,
        lambda request_id: member_names(request_id)[0],
        lambda: len(arm.vms),
        fail_last,
        lambda request_id: arm.evict(member_names(request_id)[-1]),
    )


def kube_rig(fakes: NewCloudFakes, tmp: Path, bin_dir: Path) -> Rig:
    from providers.kubernetes import KubernetesProvider
    from tests.providers.kubernetes.support import CONFIG, GPUCLOUD, NAMESPACE, ONPREM

    onprem = fakes.kube["onprem"]
    provider = KubernetesProvider(
        cluster=CLUSTER,
        regions=(ONPREM, GPUCLOUD),
        kubeconfig=str(fakes.kubeconfig),
        launch_config=CONFIG,
        clock=FakeClock(T0),
        sleep=lambda s: None,
    )

    def of_request(request_id: str) -> list[dict[str, Any]]:
        pods = [c.body for c in onprem.requests_for("pods", "create")]
        mine = [
            p
            for p in pods
            if p["metadata"]["annotations"]["heliotrope.io/request-id"] == request_id
        ]
        return [p for p in mine if p["metadata"]["name"] in onprem.pods]

    def nodes(request_id: str) -> list[Node]:
        got = []
        for pod in of_request(request_id):
            container = pod["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in container["env"]}
            command = container["command"]
            assert command[0] == "torchrun"
            got.append((env, command[1:]))
        return got

    def gang_name(request_id: str) -> str:
        return str(of_request(request_id)[0]["metadata"]["labels"]["heliotrope-gang"])

    def fail_last() -> None:
        onprem.failing_creates.extend([None] * (COUNT - 1))
        onprem.failing_creates.append("status_403_quota.json")

    def preempt_last(request_id: str) -> None:
        onprem.remove(of_request(request_id)[-1]["metadata"]["name"])

    return Rig(
        provider,
        "k8s:onprem:a100-80gbx1:on_demand",
        COUNT,
        1,
        nodes,
        lambda request_id: f"{gang_name(request_id)}-0.{gang_name(request_id)}.{NAMESPACE}.svc",
        lambda: len(onprem.pods) + len(onprem.services),  # a gang's headless Service too
        fail_last,
        preempt_last,
        extra=1,
    )


def local_rig(tmp: Path, bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Rig:
    from providers.local import LocalProvider, local_offers
    from providers.local import provider as local_module

    monkeypatch.setattr(local_module, "TORCHRUN", (str(bin_dir / "torchrun"),))
    out = tmp / "local-node"
    out.mkdir()
    monkeypatch.setenv("NODE_OUT", str(out))
    provider = LocalProvider(
        tmp / "local",
        cluster=CLUSTER,
        offers=local_offers(["west"], gpu_count=2),
        capacity={"west": COUNT},
        clock=FakeClock(T0),
        grace_s=2.0,
    )
    hold = ("sleep", "60")

    def fail_last() -> None:  # a local gang is one node: a gang that does not fit is refused
        other = LaunchSpec(job_id="other", offer_id=LOCAL_OFFER, cluster=CLUSTER, entrypoint=hold)
        assert provider.launch(other, request_id="other").ok

    def ours() -> int:
        found = provider.list_instances(cluster=CLUSTER).values()
        return sum(1 for info in found if info.job_id == "job-1")

    def preempt_last(request_id: str) -> None:
        [instance] = provider.list_instances(cluster=CLUSTER)
        provider.preempt(instance, notice_s=0.0)

    return Rig(
        provider,
        LOCAL_OFFER,
        1,
        2 * COUNT,
        lambda request_id: [read_node(out)],
        lambda request_id: "127.0.0.1",
        ours,
        fail_last,
        preempt_last,
    )


PROVIDERS = ("aws", "gcp", "azure", "kubernetes", "local")


@pytest.fixture(params=PROVIDERS)
def rig(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "curl", FAKE_CURL)
    executable(bin_dir / "torchrun", FAKE_TORCHRUN)
    name = request.param
    if name in ("aws", "gcp"):
        fakes = request.getfixturevalue("cloud_fakes")
        yield (aws_rig if name == "aws" else gcp_rig)(fakes, tmp_path, bin_dir)
    elif name in ("azure", "kubernetes"):
        fakes = request.getfixturevalue("new_cloud_fakes")
        yield (azure_rig if name == "azure" else kube_rig)(fakes, tmp_path, bin_dir)
    else:
        made = local_rig(tmp_path, bin_dir, monkeypatch)
        yield made
        for instance in made.provider.list_instances(cluster=CLUSTER):
            made.provider.terminate([instance], request_id="cleanup")


def launch(rig: Rig, request_id: str) -> Any:
    return rig.provider.launch(
        LaunchSpec(
            job_id="job-1",
            offer_id=rig.offer,
            cluster=CLUSTER,
            count=COUNT,
            entrypoint=ENTRYPOINT,
            env={"WANDB_PROJECT": "gangs"},
        ),
        request_id=request_id,
    )


def test_every_provider_gives_rank_r_the_same_variables_and_torchrun_line(rig: Rig) -> None:
    outcome = launch(rig, "gang-1")
    assert outcome.ok, outcome.error
    nodes = rig.nodes("gang-1")
    assert len(nodes) == rig.nnodes
    master = rig.master("gang-1")
    for rank, (env, argv) in enumerate(nodes):
        names = {*gang.TORCH_NAMES, *(f"PET_{n}" for n in gang.TORCH_NAMES), *gang.HELIOTROPE_NAMES}
        assert names <= set(env), names - set(env)
        for name in gang.RANK_NAMES:
            assert env[name] == str(rank)
        assert env["NNODES"] == env["PET_NNODES"] == env["HELIOTROPE_NUM_NODES"] == str(rig.nnodes)
        assert env["NPROC_PER_NODE"] == env["HELIOTROPE_NPROC_PER_NODE"] == str(rig.nproc)
        assert (
            env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == env["HELIOTROPE_MASTER_ADDR"] == master
        )
        port = env["MASTER_PORT"]
        assert port == env["HELIOTROPE_MASTER_PORT"] and 1024 <= int(port) < 65536
        assert env["HELIOTROPE_INSTANCE_ID"] == outcome.instance_id  # the gang's id
        assert env["HELIOTROPE_REQUEST_ID"] == "gang-1" and env["HELIOTROPE_JOB_ID"] == "job-1"
        assert env["HELIOTROPE_CLUSTER"] == CLUSTER and env["HELIOTROPE_OFFER_ID"] == rig.offer
        assert env["WANDB_PROJECT"] == "gangs"  # the job's own environment too
        assert argv == [
            f"--nnodes={rig.nnodes}",
            f"--nproc-per-node={rig.nproc}",
            f"--node-rank={rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master}:{port}",
            "--rdzv-id=gang-1",
            "--no-python",
            *ENTRYPOINT,
        ]
    assert len({env["MASTER_PORT"] for env, _ in nodes}) == 1


def test_a_gang_whose_last_node_cannot_be_launched_leaves_no_instance(rig: Rig) -> None:
    rig.fail_last()
    outcome = launch(rig, "gang-short")
    assert outcome.instance_id is None and outcome.error is not None
    assert outcome.error.kind in (FailureKind.CAPACITY, FailureKind.QUOTA)
    assert rig.live() == 0


def test_a_retried_gang_launch_adopts_the_gang_instead_of_buying_another(rig: Rig) -> None:
    first = launch(rig, "gang-2")
    assert first.ok, first.error
    up = rig.live()
    assert up == (COUNT if rig.nnodes > 1 else 1) + rig.extra
    again = launch(rig, "gang-2")
    assert again.instance_id == first.instance_id
    assert rig.live() == up


def test_a_preempted_node_preempts_the_whole_gang_once(rig: Rig) -> None:
    outcome = launch(rig, "gang-3")
    assert outcome.ok, outcome.error
    rig.provider.poll_events()  # what launching reported (nothing, or progress)
    rig.preempt_last("gang-3")
    events = [e for e in rig.provider.poll_events() if e.type is EventType.PREEMPTED]
    assert [(e.instance_id, e.job_id) for e in events] == [(outcome.instance_id, "job-1")]
    if Capability.ACKNOWLEDGE not in rig.provider.capabilities():  # local repeats it until
        assert not [e for e in rig.provider.poll_events() if e.type is EventType.PREEMPTED]


def test_an_unexpected_error_part_way_still_rolls_the_gang_back() -> None:
    """A bug (not a cloud's error) after rank 0 is up: what the request made is deleted,
    and the error is raised, not turned into a refusal."""
    spec = LaunchSpec(job_id="j", offer_id="aws:us-east-1a:p5.48xlarge:spot", cluster=CLUSTER)
    undone: list[str] = []

    def start() -> None:
        raise KeyError("a bug after rank 0 started")

    with pytest.raises(KeyError):
        gang.all_or_none(
            gang_id="g",
            spec=spec,
            request_id="r",
            start=start,
            roll_back=lambda: undone.append("r"),
            call_errors=(OSError,),
            failure_of=lambda exc: gang.invalid_offer(spec, str(exc)),
        )
    assert undone == ["r"]
