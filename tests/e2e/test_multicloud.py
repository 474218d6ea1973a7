"""The live controller over two clouds (`providers: [aws, gcp]`) end to end: AWS through
moto in process (with the AWS suite's botocore hooks for what moto does not model), GCP
through the GCP suite's recorded-response Compute Engine endpoint.

A job starts on the cheapest spot offer, L4 in AWS us-east-1a. It writes a checkpoint into
that region's store. AWS then reclaims the instance (terminated behind the adapter's back,
and the spot request says `instance-terminated-by-price`). The `spot-failover` policy moves
it to another region -- the only other spot L4 with a price is GCP's us-central1-a -- so the
relaunch is a migration: the checkpoint is copied to us-central1's store and verified, the
job launches there on spot, makes (modelled) progress after the restore and finishes. Every
launch and termination is counted at the cloud APIs: nothing else was bought or ended.

Checkpoint stores are file:// directories per region (s3fs and gcsfs are not installed
here; real deployments use s3:// and gs:// URIs, see docs/providers.md).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from orchestrator.checkpoints import CheckpointRef, CheckpointStore
from orchestrator.clock import FakeClock
from orchestrator.jobs import parse_jobs
from orchestrator.live.clouds import CloudAccess, make_providers
from orchestrator.live.commands import live_controller
from orchestrator.live.controller import LiveController
from orchestrator.live.world import LiveSettings, World, configured_world
from orchestrator.loop import Controller
from orchestrator.model import EventKind, Phase, SignalKind
from orchestrator.state import MemoryStateStore, SignalSample
from providers.base import FailureKind, LaunchSpec
from providers.gcp import naming
from providers.gcp.naming import label_value
from providers.multi import MultiProvider
from tests.providers.conftest import (
    AWS_SPOT_L4,
    CLUSTER,
    GCP_SPOT_L4,
    PROJECT,
    CloudFakes,
    open_cloud_fakes,
)

JOB = "lm-spot"
STEP = 40
TICK_S = 600


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CloudFakes]:
    with open_cloud_fakes(monkeypatch, tmp_path) as f:
        yield f


def job_doc() -> dict[str, object]:
    return {
        "jobs": [
            {
                "name": JOB,
                "work_gpu_hours": 1.0,
                "gpus": 1,
                "gpu_types": ["L4"],
                "throughput": {"L4": 1.0},
                "start_offset_h": 0,
                "deadline_h": 48,
                "checkpoint_size_gb": 0.01,
                "checkpoint_interval_h": 0.1,
                "cold_start_h": 0.1,
                "command": ["python", "train.py"],
                "home_region": "us-east-1",
            }
        ]
    }


def tick(live: LiveController, clock: FakeClock) -> list[EventKind]:
    clock.advance(TICK_S)
    return [e.kind for e in live.tick()]


def aligned_now() -> FakeClock:
    """A fake clock at the real time (moto stamps LaunchTime with it), on a tick."""
    now_s = datetime.now(UTC).timestamp()
    return FakeClock(datetime.fromtimestamp(now_s - now_s % TICK_S, UTC))


def clouds_world(doc: dict[str, Any]) -> LiveSettings:
    """config.yaml of a clouds world (`doc`: the clouds settings; cluster and policy
    default to the fakes' and `spot-failover`)."""
    doc = dict(doc)
    cluster = doc.pop("cluster", CLUSTER)
    policy = doc.pop("policy", "spot-failover")
    return LiveSettings(world="clouds", cluster=cluster, policy=policy, clouds=doc)


@dataclass
class Move:
    """A job the live controller runs on `src`, to be moved to `dst`: its world, state
    store, controller and the two offers' checkpoint stores."""

    job: str
    src: str
    dst: str
    clock: FakeClock
    world: World
    store: MemoryStateStore
    live: LiveController
    src_store: CheckpointStore
    dst_store: CheckpointStore

    @property
    def controller(self) -> Controller:
        c = self.live.controller
        assert c is not None
        return c

    def tick(self) -> list[EventKind]:
        return tick(self.live, self.clock)

    def checkpoint(self, files: dict[str, bytes]) -> CheckpointRef:
        """The job checkpoints into its region's store, as it would."""
        return self.src_store.write(self.job, STEP, files, now_s=self.clock.now().timestamp())

    def planned(self, kinds: list[EventKind]) -> None:
        """The last tick saw the preemption and planned the move."""
        assert EventKind.PREEMPTED in kinds and EventKind.MIGRATION in kinds
        [planned] = self.store.open_migrations()
        assert (planned.src_offer_id, planned.dst_offer_id) == (self.src, self.dst)

    def finish(self, ref: CheckpointRef) -> CheckpointRef:
        """Tick until the moved job is done; its checkpoint was copied and verifies at the
        destination, and it was launched on `src`, then on `dst`. The copy comes back."""
        for _ in range(30):
            if self.controller.all_done and not self.store.open_migrations():
                break
            self.tick()
        assert self.controller.fleet.phase[0] == Phase.DONE and not self.store.open_migrations()
        copied = self.dst_store.latest(self.job)
        assert copied is not None and copied.manifest_sha256 == ref.manifest_sha256
        self.dst_store.verify(copied)
        assert self.dst_store.read(copied) == self.src_store.read(ref)
        history = self.store.history(self.job)
        assert [e.offer_id for e in history if e.kind is EventKind.LAUNCHED] == [self.src, self.dst]
        return copied


def start_move(
    settings: LiveSettings,
    access: Callable[[FakeClock], CloudAccess],
    clock: FakeClock,
    jobs: dict[str, object],
    src: str,
    dst: str,
) -> Move:
    """The world of `settings`, one job submitted, and the first tick: it launches on `src`."""
    world = configured_world(settings, clock=clock, access=access(clock))
    offers = {o.id: o for o in world.offers}
    assert {src, dst} <= set(offers)
    src_store = CheckpointStore(world.store_uri(offers[src]), durable=False)
    dst_store = CheckpointStore(world.store_uri(offers[dst]), durable=False)
    assert src_store.root_uri != dst_store.root_uri
    store = MemoryStateStore(clock=clock)
    [job] = parse_jobs(jobs, trace_start=clock.now())
    store.submit([job])
    live = live_controller(world, store)
    move = Move(job.id, src, dst, clock, world, store, live, src_store, dst_store)
    assert EventKind.LAUNCHED in [e.kind for e in live.tick()]
    c = move.controller
    assert c.offers[int(c.fleet.offer[0])].id == src
    return move


def vm_puts(arm: Any) -> list[Any]:
    """The VM creates the fake Resource Manager was asked for."""
    return [
        call
        for call in arm.calls
        if call.method == "PUT" and call.action == "Microsoft.Compute/virtualMachines/write"
    ]


def pod_env(create: Any) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in create.body["spec"]["containers"][0]["env"]}


@pytest.mark.timeout(120)
def test_spot_job_preempted_on_aws_moves_to_gcp_with_its_checkpoint(fakes: CloudFakes) -> None:
    move = start_move(
        clouds_world(fakes.settings_doc()),
        lambda clock: fakes.access(sleep=clock.sleep),
        aligned_now(),
        job_doc(),
        AWS_SPOT_L4,
        GCP_SPOT_L4,
    )
    world, store, live = move.world, move.store, move.live
    assert {o.cloud for o in world.offers} == {"aws", "gcp"}
    assert live.options.progress_from_provider is False  # clouds run code we cannot see

    # 1. The job started on the cheapest spot offer: L4 in AWS us-east-1a.
    c = move.controller
    aws_instance = c.instance_of[0]
    assert aws_instance is not None and aws_instance.startswith("i-")
    [run] = fakes.aws_ops("ec2:RunInstances")
    assert run["InstanceMarketOptions"]["MarketType"] == "spot"
    assert fakes.raw.state(aws_instance) == "running"
    for _ in range(2):
        move.tick()
    assert c.fleet.progress_gpu_h[0] > 0  # modelled progress

    # 2. The job checkpoints into its region's store, as it would.
    ref = move.checkpoint({"model.pt": b"weights" * 1000, "optim.pt": b"adam" * 500})

    # 3. AWS reclaims the spot instance, behind the adapter's back.
    tagged = fakes.raw.tags(aws_instance)
    fakes.raw.terminate(aws_instance)
    fakes.answer_spot_reclaimed(aws_instance, job_id=JOB, request_id=tagged["heliotrope:request"])
    move.planned(move.tick())

    # 4. The controller moves it: copy, verify, launch at GCP, restore, run, finish.
    copied = move.finish(ref)
    c = move.controller
    assert copied.step == ref.step == STEP
    assert move.src_store.latest(JOB) == ref  # the source is only ever read

    # The job launched at GCP on spot, with our labels and its checkpoint location.
    [insert] = fakes.gcp_ops("compute.instances.insert")
    body = insert.body
    assert body["machineType"] == "zones/us-central1-a/machineTypes/g2-standard-4"
    assert body["scheduling"]["provisioningModel"] == "SPOT"
    assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert body["labels"]["heliotrope-cluster"] == label_value(CLUSTER)
    assert body["labels"]["heliotrope-job"] == label_value(JOB)
    startup = {i["key"]: i["value"] for i in body["metadata"]["items"]}["startup-script"]
    assert f"HELIOTROPE_CHECKPOINT_URI={move.dst_store.root_uri}" in startup

    history = store.history(JOB)
    steps = [e.detail for e in history if e.kind is EventKind.MIGRATION]
    for phase in (
        "planned -> copying",
        "copying -> provisioning",
        "provisioning -> restoring",
        "restoring -> running",
        "running -> done",
    ):
        assert any(phase in s for s in steps), (phase, steps)
    assert [e.offer_id for e in history if e.kind is EventKind.PREEMPTED] == [AWS_SPOT_L4]
    [finished] = [e for e in history if e.kind is EventKind.FINISHED]
    assert finished.offer_id == GCP_SPOT_L4
    assert c.fleet.preemptions[0] == 1 and c.fleet.migrations[0] == 1

    # Nothing else was bought or ended: one RunInstances (AWS), one insert (GCP); AWS ended
    # the first instance itself, and the GCP one was deleted once the job finished.
    assert len(fakes.aws_ops("ec2:RunInstances")) == 1
    assert fakes.aws_ops("ec2:TerminateInstances") == []
    assert fakes.raw.count("us-east-1") == 1 and fakes.raw.count("us-west-2") == 0
    assert fakes.raw.state(aws_instance) == "terminated"
    [delete] = fakes.gcp_ops("compute.instances.delete")
    assert delete.path.endswith("/zones/us-central1-a/instances/" + body["name"])
    assert fakes.compute.instances == {}
    assert world.provider.list_instances(cluster=CLUSTER) == {}


@pytest.mark.timeout(120)
def test_multi_provider_routes_each_instance_to_its_cloud_and_leaves_others_alone(
    fakes: CloudFakes, tmp_path: Path
) -> None:
    clock = FakeClock(datetime.now(UTC))
    settings = fakes.settings()
    access = fakes.access(sleep=clock.sleep)
    hour = clock.now().replace(minute=0, second=0, microsecond=0)
    world = configured_world(clouds_world(fakes.settings_doc()), clock=clock, access=access)
    store = MemoryStateStore(clock=clock)
    store.append_samples(
        [
            SignalSample(
                time=hour,
                key="US-MIDA-PJM",
                kind=SignalKind.CARBON,
                value=123.0,
                unit="g_co2_per_kwh",
                source="test",
                observed_at=clock.now(),
            )
        ]
    )
    frame = world.view(store).frame(clock.now().timestamp())
    multi = world.provider
    o = [o.id for o in world.offers].index(AWS_SPOT_L4)
    assert frame.grid.carbon_hourly_known[frame.k, o]
    assert frame.grid.carbon_g_per_kwh[frame.k, o] == 123.0
    g = [o.id for o in world.offers].index(GCP_SPOT_L4)
    assert not frame.grid.carbon_hourly_known[frame.k, g]  # the yearly average, a prior

    def spec(offer: str) -> LaunchSpec:
        return LaunchSpec(job_id=JOB, offer_id=offer, cluster=CLUSTER, entrypoint=("train",))

    aws_id = multi.launch(spec(AWS_SPOT_L4), request_id="req-aws").instance_id
    gcp_id = multi.launch(spec(GCP_SPOT_L4), request_id="req-gcp").instance_id
    assert aws_id and gcp_id and multi.owner_of(aws_id) == "aws" and multi.owner_of(gcp_id) == "gcp"
    refused = multi.launch(spec("azure:eastus-1:standard_nc24ads_a100_v4:spot"), request_id="r")
    assert refused.error is not None and refused.error.kind is FailureKind.INVALID
    assert len(fakes.aws_ops("ec2:RunInstances")) == 1
    assert len(fakes.gcp_ops("compute.instances.insert")) == 1

    # Instances that are not ours, in both clouds, with ids that look like ours.
    untagged = fakes.raw.run(instance_type="g6.xlarge")[0]
    other = fakes.raw.run(tags={"heliotrope:cluster": "someone-else"}, instance_type="g6.xlarge")[0]
    foreign = naming.gang_for(
        project=PROJECT, cluster="other-team", request_id="x", zone="us-central1-a", count=1
    )
    fakes.compute.add_instance("us-central1-a", "instance_other_cluster.json", foreign.name)
    multi.terminate(
        [untagged, other, foreign.instance_id, "i-0123456789abcdef0"], request_id="t-foreign"
    )
    assert fakes.aws_ops("ec2:TerminateInstances") == []
    assert fakes.gcp_ops("compute.instances.delete") == []
    assert multi.list_instances(cluster=CLUSTER).keys() == {aws_id, gcp_id}

    # Remembered from the launch: the AWS id goes to AWS only.
    multi.terminate([aws_id], request_id="t-aws")
    [ended] = fakes.aws_ops("ec2:TerminateInstances")
    assert ended["InstanceIds"] == [aws_id] and fakes.gcp_ops("compute.instances.delete") == []

    # A restarted controller's provider knows nothing yet: it learns the id by listing.
    fresh = MultiProvider(list(make_providers(settings, clock=clock, access=access).values()))
    fresh.terminate([gcp_id, untagged], request_id="t-gcp")
    [delete] = fakes.gcp_ops("compute.instances.delete")
    assert delete.path.endswith("/" + gcp_id.split("/", 1)[1])
    assert len(fakes.aws_ops("ec2:TerminateInstances")) == 1
    assert fresh.list_instances(cluster=CLUSTER) == {}
    assert fakes.raw.state(untagged) == "running" and fakes.raw.state(other) == "running"
    assert ("us-central1-a", foreign.name) in fakes.compute.instances


# -- through the registry: Azure <-> Kubernetes ---------------------------------------------------

AZURE_SPOT_A100 = "azure:eastus:Standard_NC24ads_A100_v4:spot"
K8S_SPOT_A100 = "k8s:onprem:a100-80gbx1:spot"
A100_JOB = "lm-a100"
T_AZURE = datetime(2024, 5, 1, 17, 0, tzinfo=UTC)


def a100_job_doc() -> dict[str, object]:
    doc = job_doc()
    [job] = doc["jobs"]  # type: ignore[misc]
    job.update(
        name=A100_JOB, gpu_types=["A100-80GB"], throughput={"A100-80GB": 1.0}, home_region="eastus"
    )
    return doc


@pytest.mark.timeout(120)
def test_spot_job_evicted_on_azure_moves_to_a_kubernetes_spot_pool_with_its_checkpoint(
    tmp_path: Path,
) -> None:
    """The same move between the two clouds added through the registry: Azure (the fake
    Resource Manager through the SDK) and Kubernetes (the fake API servers through the
    client). The on-premises cluster has a spot pool: one of its A100 nodes is labelled
    `karpenter.sh/capacity-type=spot` and priced at 0.78 $/GPU-h, between Azure's spot A100
    in eastus (0.7346 $/h) and in swedencentral (0.8081 $/h)."""
    from tests.providers.conftest import open_new_cloud_fakes

    with open_new_cloud_fakes(tmp_path) as new:
        new.label_spot("onprem", "dgx-a100-01")
        k8s = new.k8s_section()
        k8s["contexts"][0]["spot_usd_per_gpu_hour"] = {"A100-80GB": 0.78}
        checkpoints = {"default": f"file://{tmp_path}/checkpoints/{{cloud}}/{{region}}"}
        settings = {"providers": ["azure", "k8s"], "azure": new.azure_section(), "k8s": k8s}
        move = start_move(
            clouds_world({**settings, "checkpoints": checkpoints}),
            lambda clock: new.access(sleep=clock.sleep),
            FakeClock(T_AZURE),
            a100_job_doc(),
            AZURE_SPOT_A100,
            K8S_SPOT_A100,
        )

        # 1. The cheapest spot A100: Azure eastus, a Spot VM with eviction policy Delete.
        [put] = vm_puts(new.arm)
        assert put.body["properties"]["priority"] == "Spot"
        assert put.body["properties"]["evictionPolicy"] == "Delete"
        [vm_name] = list(new.arm.vms)
        for _ in range(2):
            move.tick()
        ref = move.checkpoint({"model.pt": b"w" * 4000})

        # 2. Azure evicts the VM: it is gone (eviction policy Delete).
        new.arm.evict(vm_name)
        move.planned(move.tick())

        # 3. Copied, verified, launched as a pod on the spot node, restored, run, done.
        move.finish(ref)
        onprem = new.kube["onprem"]
        [create] = onprem.requests_for("pods", "create")
        pod = create.body
        assert pod_env(create)["HELIOTROPE_CHECKPOINT_URI"] == move.dst_store.root_uri
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "karpenter.sh/capacity-type" in json.dumps(pod["spec"]["affinity"])
        assert new.kube["gpucloud"].requests_for("pods", "create") == []
        assert onprem.pods == {}  # deleted once the job finished
        history = move.store.history(A100_JOB)
        assert [e.offer_id for e in history if e.kind is EventKind.FINISHED] == [K8S_SPOT_A100]
        # Nothing else bought: one VM create at Azure, one pod, and no VM left there.
        assert len(vm_puts(new.arm)) == 1
        assert new.arm.vms == {}


K8S_SPOT_L4 = "k8s:onprem:l4x1:spot"


@pytest.mark.timeout(120)
def test_spot_job_reclaimed_on_aws_moves_to_a_kubernetes_spot_pool(
    fakes: CloudFakes, tmp_path: Path
) -> None:
    """The first test's reclaim, with `providers: [aws, k8s]`: the only other spot L4 is the
    on-premises cluster's L4 node (back to Ready, in a spot pool, 0.30 $/GPU-h)."""
    from tests.providers.conftest import open_new_cloud_fakes

    with open_new_cloud_fakes(tmp_path) as new:
        new.make_ready("onprem", "l4-box-01")
        new.label_spot("onprem", "l4-box-01")
        k8s = new.k8s_section()
        k8s["contexts"][0]["spot_usd_per_gpu_hour"] = {"L4": 0.30}
        doc = fakes.settings_doc(providers=["aws", "k8s"], k8s=k8s)
        del doc["gcp"]
        move = start_move(
            clouds_world(doc),
            lambda clock: fakes.access(sleep=clock.sleep),
            aligned_now(),
            job_doc(),
            AWS_SPOT_L4,
            K8S_SPOT_L4,
        )
        aws_instance = move.controller.instance_of[0]
        assert aws_instance is not None
        move.tick()
        ref = move.checkpoint({"model.pt": b"weights" * 1000})
        tagged = fakes.raw.tags(aws_instance)
        fakes.raw.terminate(aws_instance)
        fakes.answer_spot_reclaimed(
            aws_instance, job_id=JOB, request_id=tagged["heliotrope:request"]
        )
        move.planned(move.tick())
        move.finish(ref)
        [create] = new.kube["onprem"].requests_for("pods", "create")
        assert pod_env(create)["HELIOTROPE_CHECKPOINT_URI"] == move.dst_store.root_uri
        assert "karpenter.sh/capacity-type" in json.dumps(create.body["spec"]["affinity"])
        assert new.kube["onprem"].pods == {}
        assert len(fakes.aws_ops("ec2:RunInstances")) == 1
        assert fakes.aws_ops("ec2:TerminateInstances") == []


@pytest.mark.timeout(120)
def test_spot_pod_preempted_on_kubernetes_moves_to_azure_with_its_checkpoint(
    tmp_path: Path,
) -> None:
    """The reverse: the on-premises spot pool is the cheapest (0.50 $/GPU-h), the scheduler
    preempts the pod (a DisruptionTarget, then the pod is gone), and the job moves to
    Azure's spot A100 in eastus with its checkpoint."""
    from tests.providers.conftest import open_new_cloud_fakes

    with open_new_cloud_fakes(tmp_path) as new:
        new.label_spot("onprem", "dgx-a100-01")
        k8s = new.k8s_section()
        k8s["contexts"][0]["spot_usd_per_gpu_hour"] = {"A100-80GB": 0.50}
        checkpoints = {"default": f"file://{tmp_path}/ckpt/{{cloud}}/{{region}}"}
        settings = {"providers": ["k8s", "azure"], "k8s": k8s, "azure": new.azure_section()}
        move = start_move(
            clouds_world({**settings, "checkpoints": checkpoints}),
            lambda clock: new.access(sleep=clock.sleep),
            FakeClock(T_AZURE),
            a100_job_doc(),
            K8S_SPOT_A100,
            AZURE_SPOT_A100,
        )
        onprem = new.kube["onprem"]
        [pod_name] = list(onprem.pods)
        move.tick()
        ref = move.checkpoint({"model.pt": b"w" * 4000})

        # The scheduler preempts the pod: first the notice, then it is gone.
        onprem.disrupt(pod_name, reason="PreemptionByScheduler", message="preempted")
        move.tick()
        onprem.remove(pod_name)
        kinds = move.tick()
        history = move.store.history(A100_JOB)
        assert EventKind.PREEMPTED in [e.kind for e in history], kinds
        move.finish(ref)
        [put] = vm_puts(new.arm)
        assert put.body["properties"]["priority"] == "Spot"
        custom = put.body["properties"]["osProfile"]["customData"]
        assert (
            f"HELIOTROPE_CHECKPOINT_URI={move.dst_store.root_uri}"
            in base64.b64decode(custom).decode()
        )
        assert new.arm.vms == {} and onprem.pods == {}  # the VM deleted once done
        assert len(onprem.requests_for("pods", "create")) == 1
