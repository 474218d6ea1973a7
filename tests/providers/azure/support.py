"""Constants and helpers of the Azure adapter tests (the fixtures are in conftest.py).

This folder is not a package: as `tests/providers/azure/` with an `__init__.py` it would be
imported as a top-level package named `azure` and hide the Azure SDK. Modules here import
each other by their full path (`tests.providers.azure.fake_arm`), and test files are named
`test_azure_*.py` so their names are unique in the session.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from providers.azure import AzureLaunchConfig, AzureProvider
from tests.providers.specs import spec_maker

SUBSCRIPTION = "8f2b6c1e-3a4d-4e5f-9a0b-1c2d3e4f5a6b"
RESOURCE_GROUP = "heliotrope-ml"
CLUSTER = "ml-prod"
REGIONS = ("eastus", "swedencentral")
T0 = datetime(2024, 5, 1, 17, 0, tzinfo=UTC)
SPOT_A100 = "azure:eastus:Standard_NC24ads_A100_v4:spot"
OD_A100 = "azure:eastus:Standard_NC24ads_A100_v4:on_demand"
SPOT_H100_SE = "azure:swedencentral:Standard_ND96isr_H100_v5:spot"
SUBNETS = {
    region: (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/"
        f"Microsoft.Network/virtualNetworks/heliotrope-{region}/subnets/gpu"
    )
    for region in REGIONS
}
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHeliotropeTestKeyOnly heliotrope@test"
CONFIG = AzureLaunchConfig(subnet_ids=SUBNETS, ssh_public_key=SSH_KEY, poll_interval_s=0.0)

Factory = Callable[..., AzureProvider]


spec = spec_maker(SPOT_A100, cluster=CLUSTER, startup_s=600.0)
