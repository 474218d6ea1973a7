"""Region -> grid zone, and ARM error codes -> failure kinds."""

from __future__ import annotations

import pytest

from orchestrator import catalog
from providers.azure import errors, regions
from providers.base import FailureKind


def test_the_gpu_regions_are_in_the_catalog() -> None:
    """The regions Azure sells GPU sizes in, each with a grid zone and continent."""
    wanted = {
        "eastus",
        "southcentralus",
        "westus3",
        "swedencentral",
        "norwayeast",
        "japaneast",
        "koreacentral",
        "southeastasia",
        "australiaeast",
        "uaenorth",
        "centralindia",
        "brazilsouth",
        "southafricanorth",
    }
    assert wanted <= set(regions.known_regions())
    for region in catalog.regions("azure"):
        info = catalog.region_info("azure", region)
        assert info is not None and info.grid_zone and info.continent in catalog.CONTINENTS


@pytest.mark.parametrize(
    ("region", "zone"),
    [
        ("eastus", "US-MIDA-PJM"),
        ("eastus-2", "US-MIDA-PJM"),
        ("japaneast", "JP-TK"),
        ("NorwayEast", "NO-NO1"),
        ("atlantis", None),
    ],
)
def test_grid_zone(region: str, zone: str | None) -> None:
    assert regions.grid_zone(region) == zone


@pytest.mark.parametrize(
    ("codes", "message", "status", "kind"),
    [
        (["AllocationFailed"], "", None, FailureKind.CAPACITY),
        (["ZonalAllocationFailed"], "", None, FailureKind.CAPACITY),
        (["OverconstrainedAllocationRequest"], "", None, FailureKind.CAPACITY),
        (["SkuNotAvailable"], "", 409, FailureKind.CAPACITY),
        (
            ["OperationNotAllowed"],
            "exceeding approved Total Regional Cores quota",
            409,
            FailureKind.QUOTA,
        ),
        (["OperationNotAllowed", "QuotaExceeded"], "", 409, FailureKind.QUOTA),
        (["OperationNotAllowed"], "VM is being deleted", 409, FailureKind.INVALID),
        (["TooManyRequests"], "", 429, FailureKind.TRANSIENT),
        ([], "", 503, FailureKind.TRANSIENT),
        (["AuthorizationFailed"], "", 403, FailureKind.AUTH),
        (["LinkedAuthorizationFailed"], "", 403, FailureKind.AUTH),
        (["InvalidAuthenticationToken"], "", 401, FailureKind.AUTH),
        (["InvalidParameter"], "", 400, FailureKind.INVALID),
        (["ResourceGroupNotFound"], "", 404, FailureKind.INVALID),
        (["SomethingNew"], "", None, FailureKind.TRANSIENT),
    ],
)
def test_classify(codes: list[str], message: str, status: int | None, kind: FailureKind) -> None:
    assert errors.classify(codes, message, status) is kind


def test_a_missing_credential_is_auth_and_names_the_docs() -> None:
    from azure.core.exceptions import ClientAuthenticationError

    failure = errors.failure_from_exception(ClientAuthenticationError("no token"))
    assert failure.kind is FailureKind.AUTH and "docs/providers.md" in failure.message


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cluster": ""}, "cluster"),
        ({"cluster": "x" * 257}, "cluster"),
        ({"regions": ()}, "regions"),
        ({"resource_group": ""}, "subscription_id, resource_group"),
    ],
)
def test_bad_settings_name_the_field(overrides: dict[str, object], field: str) -> None:
    from orchestrator.errors import InputError
    from providers.azure import AzureProvider

    kwargs: dict[str, object] = {
        "cluster": "c",
        "subscription_id": "s",
        "resource_group": "rg",
        "regions": ["eastus"],
    }
    with pytest.raises(InputError) as raised:
        AzureProvider(**{**kwargs, **overrides})  # type: ignore[arg-type]
    assert raised.value.field == field
