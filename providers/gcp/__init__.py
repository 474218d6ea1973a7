"""Compute Engine adapter (google-cloud-compute, imported lazily inside the functions).

- `provider`: `GcpProvider`, the ComputeProvider for spot and on-demand A2/A3/G2 machines,
  and `GcpLaunchConfig` (boot image, disk, network, service account).
- `billing`: prices from the Cloud Billing Catalog API, list prices as the fallback.
- `errors`: Compute Engine errors (HTTP and operation errors) as `ProviderFailure`s.
- `naming`: instance names, request ids, labels and the startup script, all derived from
  (project, cluster, request id) so a retried launch finds what it made.

The permissions it needs are exactly those in infra/gcp/role.yaml.
"""

from providers.gcp.billing import BillingCatalog, ComputeRates, PriceQuote, parse_skus
from providers.gcp.provider import GcpLaunchConfig, GcpProvider

__all__ = [
    "BillingCatalog",
    "ComputeRates",
    "GcpLaunchConfig",
    "GcpProvider",
    "PriceQuote",
    "parse_skus",
]
