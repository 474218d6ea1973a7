"""Azure in the cloud registry (providers/registry.py): settings, build, check, and facts.

The `azure:` section of the clouds settings:

    azure:
      subscription_id: 8f2b6c1e-...
      resource_group: heliotrope-ml
      regions: [eastus, swedencentral]
      subnet_ids: {eastus: /subscriptions/.../subnets/gpu, swedencentral: ...}
      ssh_public_key_file: ~/.ssh/heliotrope.pub
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import catalog
from orchestrator.errors import InputError
from providers.registry import BuildContext, CheckRow, CloudSpec

if TYPE_CHECKING:
    from providers.azure import AzureProvider

CLOUD: Final = "azure"


class AzureSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subscription_id: str = Field(min_length=1)
    resource_group: str = Field(min_length=1)
    regions: list[str] = Field(min_length=1)
    subnet_ids: dict[str, str] = Field(default_factory=dict)  # region -> subnet resource id
    ssh_public_key: str | None = None
    ssh_public_key_file: Path | None = None
    admin_username: str = "heliotrope"
    image: str | None = None  # a marketplace URN publisher:offer:sku:version
    os_disk_gb: int = Field(default=256, gt=0)
    os_disk_type: str = "Premium_LRS"
    accelerated_networking: bool = True
    managed_identity: str | None = None
    poll_interval_s: float = Field(default=5.0, ge=0)  # between polls of an ARM operation
    arm_endpoint: str | None = None  # another Azure cloud's Resource Manager, or a test server
    prices_endpoint: str | None = None


class AzureAccess(BaseModel):
    """`CloudAccess` for Azure: a `TokenCredential` (else `DefaultAzureCredential`) and an
    azure-core transport (a test's)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    credential: Any = None
    transport: Any = None


def _ssh_key(z: AzureSettings) -> str:
    if z.ssh_public_key:
        return z.ssh_public_key
    if z.ssh_public_key_file is None:
        return ""
    path = z.ssh_public_key_file.expanduser()
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise InputError(
            "clouds settings",
            "azure.ssh_public_key_file",
            "a readable public key",
            got=f"{path}: {exc.strerror}",
        ) from None


def build(z: AzureSettings, ctx: BuildContext) -> AzureProvider:
    from providers.azure import AzureLaunchConfig, AzureProvider
    from providers.azure.prices import RETAIL_PRICES_ENDPOINT

    access = ctx.access if isinstance(ctx.access, AzureAccess) else AzureAccess()
    config: dict[str, Any] = {
        "subnet_ids": {k.strip().lower(): v for k, v in z.subnet_ids.items()},
        "ssh_public_key": _ssh_key(z),
        "admin_username": z.admin_username,
        "os_disk_gb": z.os_disk_gb,
        "os_disk_type": z.os_disk_type,
        "accelerated_networking": z.accelerated_networking,
        "managed_identity": z.managed_identity,
        "poll_interval_s": z.poll_interval_s,
    }
    if z.image:
        config["image"] = z.image
    return AzureProvider(
        cluster=ctx.cluster,
        subscription_id=z.subscription_id,
        resource_group=z.resource_group,
        regions=z.regions,
        credential=access.credential,
        transport=access.transport,
        launch_config=AzureLaunchConfig(**config),
        base_url=z.arm_endpoint,
        clock=ctx.clock,
        sleep=ctx.sleep,
        prices_endpoint=z.prices_endpoint or RETAIL_PRICES_ENDPOINT,
    )


def check(provider: AzureProvider, z: AzureSettings, ctx: BuildContext) -> list[CheckRow]:
    return provider.check_permissions()


SPEC: Final = CloudSpec(
    name=CLOUD,
    title="Azure",
    settings_model=AzureSettings,
    build=build,
    check=check,
    geography=catalog.geography(CLOUD),
    egress=catalog.egress_of(CLOUD),
    infra=("infra/azure/role.json", "infra/azure/role-subscription.json"),
    notice_source=CLOUD,  # the SDK's AzureScheduledEvents (HELIOTROPE_NOTICE_SOURCE=azure)
    # azure-identity's environment credential: never printed by `providers check`.
    secret_env=("AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PASSWORD"),
)
