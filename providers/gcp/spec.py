"""GCP in the cloud registry (providers/registry.py): settings, build, check, and facts.

The `gcp:` section of the clouds settings:

    gcp:
      project: my-gpu-project
      zones: [us-central1-a, europe-west4-a]
      billing_api_key_env: HELIOTROPE_GCP_BILLING_KEY   # the variable's name, never the key
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, ConfigDict, Field

from orchestrator import catalog
from orchestrator.errors import HeliotropeError
from providers.registry import BuildContext, CheckRow, CloudSpec, Result

if TYPE_CHECKING:
    from providers.gcp import GcpProvider

CLOUD: Final = "gcp"


class GcpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1)
    zones: list[str] = Field(min_length=1)
    billing_api_key_env: str | None = None  # the NAME of the variable that holds the key
    api_endpoint: str | None = None  # a Private Service Connect endpoint, or a test server
    billing_endpoint: str | None = None
    boot_image: str | None = None
    boot_disk_gb: int | None = Field(default=None, gt=0)
    network: str | None = None
    subnetwork: str | None = None
    external_ip: bool = False
    service_account: str | None = None


class GcpAccess(BaseModel):
    """`CloudAccess` for GCP: Google credentials (else Application Default Credentials)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    credentials: Any = None  # google.auth.credentials.Credentials


def billing_key(g: GcpSettings) -> str | None:
    """The Cloud Billing API key, read from the variable the settings name."""
    if not g.billing_api_key_env:
        return None
    return os.environ.get(g.billing_api_key_env) or None


def _credentials(ctx: BuildContext) -> Any:
    return ctx.access.credentials if isinstance(ctx.access, GcpAccess) else None


def build(g: GcpSettings, ctx: BuildContext) -> GcpProvider:
    from providers.gcp import GcpLaunchConfig, GcpProvider
    from providers.gcp.billing import BILLING_ENDPOINT

    overrides: dict[str, Any] = {
        "boot_image": g.boot_image,
        "boot_disk_gb": g.boot_disk_gb,
        "network": g.network,
        "subnetwork": g.subnetwork,
        "service_account": g.service_account,
    }
    config = GcpLaunchConfig(
        external_ip=g.external_ip, **{k: v for k, v in overrides.items() if v is not None}
    )
    return GcpProvider(
        cluster=ctx.cluster,
        project=g.project,
        zones=g.zones,
        credentials=_credentials(ctx),
        client_options={"api_endpoint": g.api_endpoint} if g.api_endpoint else None,
        clock=ctx.clock,
        billing_api_key=billing_key(g),
        launch_config=config,
        billing_endpoint=g.billing_endpoint or BILLING_ENDPOINT,
        sleep=ctx.sleep,
    )


def check(provider: GcpProvider, g: GcpSettings, ctx: BuildContext) -> list[CheckRow]:
    """Credentials, the adapter's reads, and Cloud Billing prices (Compute Engine has no dry
    run: infra/gcp/role.yaml grants `compute.instances.create`)."""
    from providers.gcp.billing import SOURCE_BILLING
    from providers.gcp.provider import CLOUD_PLATFORM_SCOPE

    out: list[CheckRow] = []

    def add(check: str, result: Result, reason: str) -> None:
        out.append((check, result, reason))

    given = _credentials(ctx)
    if given is not None:
        add("credentials", "ok", f"given by the caller ({type(given).__name__})")
    else:
        import google.auth
        from google.auth import exceptions as auth_exceptions

        try:
            creds, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
        except auth_exceptions.GoogleAuthError as exc:
            add(
                "credentials",
                "fail",
                f"no Application Default Credentials: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
            )
            add("compute", "skip", "no usable Google credentials (see above)")
            return out
        who = getattr(creds, "service_account_email", None) or ""
        add(
            "credentials",
            "ok",
            "application default credentials "
            f"({type(creds).__name__}{', ' + who if who else ''}"
            f"{', project ' + project if project else ''})",
        )

    zones = ", ".join(provider.zones)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("compute.machineTypes.list", lambda: f"{len(provider.offers())} offers in {zones}"),
        (
            "compute.instances.list",
            lambda: (
                f"{len(provider.list_instances(cluster=ctx.cluster))} instance(s) of "
                f"cluster {ctx.cluster} in project {g.project}"
            ),
        ),
        (
            "compute.zoneOperations.list",
            lambda: (
                f"preemption operations readable in {zones} ({len(provider.poll_events())} of ours)"
            ),
        ),
    ]
    for name, run in checks:
        try:
            add(name, "ok", run())
        except HeliotropeError as exc:
            add(name, "fail", str(exc))
    add(
        "compute.instances.create",
        "skip",
        "Compute Engine has no dry run; infra/gcp/role.yaml grants it and the first launch "
        "reports AUTH if it is missing",
    )
    if not g.billing_api_key_env:
        add(
            "cloudbilling.services.skus.list",
            "skip",
            "no billing_api_key_env: list prices are used",
        )
    elif billing_key(g) is None:
        add(
            "cloudbilling.services.skus.list",
            "fail",
            f"${g.billing_api_key_env} is not set: list prices are used",
        )
    else:
        try:
            sources = {q.source for q in provider.prices().values()}
        except HeliotropeError as exc:
            add("cloudbilling.services.skus.list", "fail", str(exc))
        else:
            if SOURCE_BILLING in sources:
                add(
                    "cloudbilling.services.skus.list", "ok", "prices from the Cloud Billing Catalog"
                )
            else:
                add(
                    "cloudbilling.services.skus.list",
                    "fail",
                    "the Cloud Billing Catalog gave no price (the key was refused or the API "
                    "failed; see the log): list prices are used",
                )
    return out


def secrets(g: GcpSettings) -> Sequence[str]:
    key = billing_key(g)
    return (key,) if key else ()


SPEC: Final = CloudSpec(
    name=CLOUD,
    title="GCP",
    settings_model=GcpSettings,
    build=build,
    check=check,
    geography=catalog.geography(CLOUD),
    egress=catalog.egress_of(CLOUD),
    infra=("infra/gcp/role.yaml",),
    notice_source=CLOUD,
    price_sources=("gcp-billing",),
    connection_id="google_cloud_default",
    secrets=secrets,
)
