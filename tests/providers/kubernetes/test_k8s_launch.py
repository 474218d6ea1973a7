"""Launch: the pod and Service bodies, idempotency, foreign pods, refusals."""

from __future__ import annotations

from typing import Any

import pytest

from providers.base import FailureKind
from providers.kubernetes import KubeLaunchConfig
from tests.providers.kubernetes.fake_kube import FakeKube, recorded
from tests.providers.kubernetes.support import (
    A100X1,
    A100X8,
    CLUSTER,
    CONFIG,
    H100X8_OD,
    H100X8_SPOT,
    NAMESPACE,
    Factory,
    spec,
)


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_a_spot_pod_asks_for_its_gpus_on_spot_nodes(
    make_provider: Factory, gpucloud: FakeKube
) -> None:
    out = make_provider().launch(spec(env={"WANDB_PROJECT": "x"}), request_id="r1")
    assert out.ok and out.instance_id is not None
    context, name = out.instance_id.split("/")
    assert context == "gpucloud"
    [create] = gpucloud.requests_for("pods", "create")
    pod = create.body
    assert pod["metadata"]["name"] == name
    assert pod["metadata"]["labels"]["heliotrope-cluster"] == CLUSTER
    assert pod["metadata"]["annotations"]["heliotrope.io/request-id"] == "r1"
    assert pod["metadata"]["annotations"]["heliotrope.io/offer-id"] == H100X8_SPOT
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["image"] == CONFIG.image
    # one node of 8 processes: the job runs under torchrun, its rendezvous on the pod itself
    assert container["command"] == [
        "torchrun",
        "--nnodes=1",
        "--nproc-per-node=8",
        "--node-rank=0",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}:29500",
        "--rdzv-id=r1",
        "--no-python",
        "python",
        "train.py",
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == CONFIG.termination_grace_s
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} in [
        e for t in terms for e in t["matchExpressions"]
    ]
    assert all(
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
        in t["matchExpressions"]
        for t in terms
    )
    env = env_of(pod)
    assert env["WANDB_PROJECT"] == "x" and env["HELIOTROPE_INSTANCE_ID"] == out.instance_id
    # the fake scheduler honoured the affinity: a spot node
    assert gpucloud.pods[name]["spec"]["nodeName"].startswith("gpu-h100-spot-")


def test_an_on_demand_pod_stays_off_spot_nodes(make_provider: Factory, gpucloud: FakeKube) -> None:
    out = make_provider().launch(spec(H100X8_OD), request_id="od")
    assert out.ok and out.instance_id is not None
    name = out.instance_id.split("/")[1]
    assert gpucloud.pods[name]["spec"]["nodeName"] == "gpu-h100-od-1"
    # the only on-demand node is taken: the next on-demand 8-GPU pod has no room
    refused = make_provider().launch(spec(H100X8_OD), request_id="od-2")
    assert refused.error is not None and refused.error.kind is FailureKind.CAPACITY


def test_the_same_request_makes_one_pod_even_after_a_restart(
    make_provider: Factory, onprem: FakeKube
) -> None:
    first = make_provider().launch(spec(A100X8), request_id="r")
    second = make_provider().launch(spec(A100X8), request_id="r")
    assert first.ok and first.instance_id == second.instance_id
    assert len(onprem.pods) == 1


def test_a_retry_is_not_refused_for_the_capacity_its_own_pods_hold(
    make_provider: Factory, onprem: FakeKube
) -> None:
    provider = make_provider()
    assert provider.launch(spec(A100X8, count=2), request_id="both").ok  # fills the pool
    again = provider.launch(spec(A100X8, count=2), request_id="both")
    assert again.ok and len(onprem.pods) == 2


def test_a_gang_gets_a_headless_service_and_ranks(make_provider: Factory, onprem: FakeKube) -> None:
    out = make_provider().launch(spec(A100X1, count=3), request_id="gang")
    assert out.ok and out.instance_id is not None
    gang = out.instance_id.split("/")[1]
    [service] = onprem.requests_for("services", "create")
    assert service.body["metadata"]["name"] == gang
    assert service.body["spec"]["clusterIP"] == "None"
    assert service.body["spec"]["selector"] == {
        "heliotrope-cluster": CLUSTER,
        "heliotrope-gang": gang,
    }
    pods = [c.body for c in onprem.requests_for("pods", "create")]
    assert [p["metadata"]["name"] for p in pods] == [f"{gang}-{k}" for k in range(3)]
    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert env["HELIOTROPE_NODE_RANK"] == str(rank) and env["HELIOTROPE_NUM_NODES"] == "3"
        assert env["HELIOTROPE_MASTER_ADDR"] == f"{gang}-0.{gang}.{NAMESPACE}.svc"
        assert pod["spec"]["subdomain"] == gang and pod["spec"]["hostname"] == f"{gang}-{rank}"


def test_a_foreign_pod_with_our_name_is_never_touched(
    make_provider: Factory, onprem: FakeKube
) -> None:
    provider = make_provider()
    name = provider.launch(spec(A100X8), request_id="x").instance_id.split("/")[1]  # type: ignore[union-attr]
    onprem.pods.clear()
    onprem.add_pod(name, labels={"app": "notebook"}, annotations={})
    out = make_provider().launch(spec(A100X8), request_id="x")
    assert out.error is not None and out.error.kind is FailureKind.INVALID
    assert "not touching it" in out.error.message
    assert not onprem.requests_for("pods", "delete")
    assert onprem.pods[name]["metadata"]["labels"] == {"app": "notebook"}


def test_a_checkpoint_pvc_is_mounted(make_provider: Factory, onprem: FakeKube) -> None:
    config = KubeLaunchConfig(image="i", checkpoint_pvc="ckpt-ml-prod")
    assert make_provider(launch_config=config).launch(spec(A100X1), request_id="p").ok
    pod = onprem.requests_for("pods", "create")[0].body
    assert pod["spec"]["volumes"] == [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt-ml-prod"}}
    ]
    assert env_of(pod)["HELIOTROPE_CHECKPOINT_DIR"] == "/checkpoints"


@pytest.mark.parametrize(
    ("status", "fixture", "kind"),
    [
        (403, "status_403_quota.json", FailureKind.QUOTA),
        (403, "status_403_rbac.json", FailureKind.AUTH),
        (422, "status_422_invalid.json", FailureKind.INVALID),
    ],
)
def test_refused_creates_come_back_as_data(
    make_provider: Factory,
    onprem: FakeKube,
    sleeps: list[float],
    status: int,
    fixture: str,
    kind: FailureKind,
) -> None:
    onprem.script("POST", "pods", "create", (status, recorded(fixture, name="p")))
    out = make_provider().launch(spec(A100X8), request_id="no")
    assert out.error is not None and out.error.kind is kind
    assert sleeps == [] and onprem.pods == {}


def test_throttling_is_retried(
    make_provider: Factory, onprem: FakeKube, sleeps: list[float]
) -> None:
    onprem.script("POST", "pods", "create", (429, recorded("status_429.json")))
    assert make_provider().launch(spec(A100X8), request_id="busy").ok
    assert len(sleeps) == 1 and len(onprem.pods) == 1


@pytest.mark.parametrize(
    ("offer", "env", "why"),
    [
        ("k8s:elsewhere:h100x8:spot", {}, "context 'elsewhere'"),
        ("k8s:gpucloud:h100x8:reserved", {}, "market 'reserved'"),
        ("k8s:gpucloud:b200x8:spot", {}, "no spot nodes with b200x8"),
        ("k8s:onprem:a100-80gbx8:spot", {}, "no spot nodes"),
        ("aws:us-east-1a:p5.48xlarge:spot", {}, "expected k8s:<context>"),
        (H100X8_SPOT, {"HF_TOKEN": "x"}, "HF_TOKEN"),
    ],
)
def test_bad_launches_are_refused(
    make_provider: Factory, kube: dict[str, FakeKube], offer: str, env: dict[str, str], why: str
) -> None:
    out = make_provider().launch(spec(offer, env=env), request_id="bad")
    assert out.error is not None and out.error.kind is FailureKind.INVALID
    assert why in out.error.message
    assert all(not f.requests_for("pods", "create") for f in kube.values())


def test_a_context_missing_from_the_kubeconfig_is_refused_as_data(
    make_provider: Factory,
) -> None:
    from providers.kubernetes import KubeRegion

    provider = make_provider(regions=(KubeRegion("nowhere"),))
    out = provider.launch(spec("k8s:nowhere:h100x8:spot"), request_id="x")
    assert out.error is not None and out.error.kind is FailureKind.INVALID
    assert "kubeconfig" in out.error.message and "nowhere" in out.error.message
