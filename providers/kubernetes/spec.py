"""Kubernetes in the cloud registry (providers/registry.py): settings, build, check, facts.

The `k8s:` section of the clouds settings (a kubeconfig context is a region):

    k8s:
      kubeconfig: ~/.kube/config          # absent: $KUBECONFIG or ~/.kube/config
      image: registry.example/trainer:1
      checkpoint_pvc: ckpt-ml-prod
      contexts:
        - context: onprem-dgx
          grid_zone: DE
          usd_per_gpu_hour: {A100-80GB: 1.10}   # amortized hardware and power
        - context: gpucloud-use1
          grid_zone: US-MIDA-PJM
          pue: 1.25
          usd_per_gpu_hour: {H100: 2.49}
          spot_usd_per_gpu_hour: {H100: 1.25}

Regions are the contexts, not catalog regions, so the spec has no geography: each context
says its grid zone. Data leaving a cluster is priced at nothing (an on-premises uplink or a
GPU cloud's contract is not billed per GB here; say so in the context's price if it is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.catalog import Egress
from orchestrator.catalog.network import free
from providers.registry import BuildContext, CheckRow, CloudSpec

if TYPE_CHECKING:
    from providers.kubernetes import KubernetesProvider

CLOUD: Final = "k8s"


class KubeContextSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context: str = Field(min_length=1)
    namespace: str = Field(default="heliotrope", min_length=1)
    grid_zone: str | None = None
    pue: float | None = Field(default=None, ge=1.0)
    usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)
    spot_usd_per_gpu_hour: dict[str, float] = Field(default_factory=dict)


class KubeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    contexts: list[KubeContextSettings] = Field(min_length=1)
    kubeconfig: str | None = None
    image: str | None = None
    gpu_label: str | None = None
    spot_labels: dict[str, str] | None = None  # {}: no spot market
    termination_grace_s: int | None = Field(default=None, gt=0)
    cpu_per_gpu: str | None = None
    memory_per_gpu: str | None = None
    checkpoint_pvc: str | None = None
    service_account: str | None = None
    unschedulable_timeout_s: float | None = Field(default=None, gt=0)


class KubeAccess(BaseModel):
    """`CloudAccess` for Kubernetes: API clients by context (else from the kubeconfig)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    api_clients: dict[str, Any] = Field(default_factory=dict)


def build(k: KubeSettings, ctx: BuildContext) -> KubernetesProvider:
    from providers.kubernetes import KubeLaunchConfig, KubeRegion, KubernetesProvider

    access = ctx.access if isinstance(ctx.access, KubeAccess) else KubeAccess()
    fields = (
        "image",
        "gpu_label",
        "spot_labels",
        "termination_grace_s",
        "cpu_per_gpu",
        "memory_per_gpu",
        "checkpoint_pvc",
        "service_account",
        "unschedulable_timeout_s",
    )
    config = {f: getattr(k, f) for f in fields if getattr(k, f) is not None}
    return KubernetesProvider(
        cluster=ctx.cluster,
        regions=[
            KubeRegion(
                context=c.context,
                namespace=c.namespace,
                grid_zone=c.grid_zone,
                pue=c.pue,
                usd_per_gpu_hour=dict(c.usd_per_gpu_hour),
                spot_usd_per_gpu_hour=dict(c.spot_usd_per_gpu_hour),
            )
            for c in k.contexts
        ],
        kubeconfig=k.kubeconfig,
        launch_config=KubeLaunchConfig(**config),
        api_clients=access.api_clients or None,
        clock=ctx.clock,
        sleep=ctx.sleep,
    )


def check(provider: KubernetesProvider, k: KubeSettings, ctx: BuildContext) -> list[CheckRow]:
    return provider.check_permissions()


SPEC: Final = CloudSpec(
    name=CLOUD,
    title="Kubernetes",
    settings_model=KubeSettings,
    build=build,
    check=check,
    geography=None,
    egress=Egress(cross_zone=0.0, inter_region=free, internet=free),
    infra=("infra/k8s/rbac.yaml",),
    notice_source=None,  # SIGTERM with the pod's grace period
)
