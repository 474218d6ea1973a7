"""Kubernetes adapter (the `kubernetes` client, imported lazily; extra `k8s`).

- `provider`: `KubernetesProvider`: jobs as pods on GPU nodes, one region per kubeconfig
  context (`KubeRegion`: namespace, grid zone, price per GPU-hour), and `KubeLaunchConfig`
  (image, GPU and spot labels, grace period, checkpoint PVC).
- `errors`: API `Status` errors as `ProviderFailure`s.

The verbs it needs are exactly those in infra/k8s/rbac.yaml.
"""

from providers.kubernetes.provider import (
    KubeLaunchConfig,
    KubeRegion,
    KubernetesProvider,
    pod_shape,
)

__all__ = ["KubeLaunchConfig", "KubeRegion", "KubernetesProvider", "pod_shape"]
