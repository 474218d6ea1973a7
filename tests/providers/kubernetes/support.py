"""Constants and helpers of the Kubernetes adapter tests (fixtures in conftest.py).

Not a package, like tests/providers/azure: `tests/providers/kubernetes/__init__.py` would make
a top-level package `kubernetes` that hides the client. Modules import each other by full
path and test files are named `test_k8s_*.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import yaml

from providers.kubernetes import KubeLaunchConfig, KubeRegion, KubernetesProvider
from tests.providers.kubernetes.fake_kube import FakeKube
from tests.providers.specs import spec_maker

CLUSTER = "ml-prod"
NAMESPACE = "heliotrope"
T0 = datetime(2024, 5, 1, 17, 0, tzinfo=UTC)
ONPREM = KubeRegion(
    context="onprem",
    namespace=NAMESPACE,
    grid_zone="DE",
    usd_per_gpu_hour={"A100-80GB": 1.10, "L4": 0.35},
)
GPUCLOUD = KubeRegion(
    context="gpucloud",
    namespace=NAMESPACE,
    grid_zone="US-MIDA-PJM",
    pue=1.25,
    usd_per_gpu_hour={"H100": 2.49},
    spot_usd_per_gpu_hour={"H100": 1.25},
)
A100X8 = "k8s:onprem:a100-80gbx8:on_demand"
A100X1 = "k8s:onprem:a100-80gbx1:on_demand"
H100X8_SPOT = "k8s:gpucloud:h100x8:spot"
H100X8_OD = "k8s:gpucloud:h100x8:on_demand"
CONFIG = KubeLaunchConfig(image="registry.example/trainer:1", unschedulable_timeout_s=300.0)

Factory = Callable[..., KubernetesProvider]


def write_kubeconfig(path: Path, fakes: dict[str, FakeKube]) -> Path:
    """A kubeconfig with one context (and cluster, and token user) per fake API server."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": next(iter(fakes)),
        "clusters": [{"name": c, "cluster": {"server": f.url}} for c, f in fakes.items()],
        "users": [{"name": f"{c}-user", "user": {"token": f.token}} for c, f in fakes.items()],
        "contexts": [
            {"name": c, "context": {"cluster": c, "user": f"{c}-user", "namespace": NAMESPACE}}
            for c in fakes
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


spec = spec_maker(H100X8_SPOT, cluster=CLUSTER, startup_s=120.0)
