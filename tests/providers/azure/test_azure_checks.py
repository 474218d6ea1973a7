"""`check_permissions`: what `heliotrope providers check` reports for Azure."""

from __future__ import annotations

from typing import Any

from providers.azure import checks
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.support import Factory


class NoCredential:
    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.identity import CredentialUnavailableError

        raise CredentialUnavailableError("EnvironmentCredential: environment not configured")


def test_everything_granted_is_ok_and_nothing_is_bought(
    make_provider: Factory, arm: FakeArm
) -> None:
    rows = {
        check: (result, reason) for check, result, reason in make_provider().check_permissions()
    }
    assert {k: v[0] for k, v in rows.items()} == {
        "credentials": "ok",
        "Microsoft.Compute/skus/read": "ok",
        "Microsoft.Compute/virtualMachines/read": "ok",
        "permissions in resource group heliotrope-ml": "ok",
        "permissions in the subscription": "ok",
        "retail prices": "ok",
    }
    assert "8 offers" in rows["Microsoft.Compute/skus/read"][1]
    assert {c.method for c in arm.calls} == {"GET"}


def test_a_missing_action_is_named_with_the_role_to_assign(
    make_provider: Factory, arm: FakeArm
) -> None:
    arm.group_permissions[0]["notActions"] = ["Microsoft.Compute/*/delete"]
    arm.subscription_permissions = [{"actions": ["Microsoft.Compute/skus/read"]}]
    rows = {
        check: (result, reason) for check, result, reason in make_provider().check_permissions()
    }
    result, reason = rows["permissions in resource group heliotrope-ml"]
    assert result == "fail"
    assert reason == (
        "missing Microsoft.Compute/disks/delete, "
        "Microsoft.Compute/virtualMachines/delete (assign infra/azure/role.json)"
    )
    result, reason = rows["permissions in the subscription"]
    assert result == "fail" and "Microsoft.Compute/locations/operations/read" in reason


def test_no_credentials_stop_the_checks(make_provider: Factory, arm: FakeArm) -> None:
    rows = make_provider(credential=NoCredential()).check_permissions()
    assert [r[:2] for r in rows] == [("credentials", "fail"), ("compute", "skip")]
    assert "docs/providers.md" in rows[0][2]
    assert arm.calls == []


def test_wildcards_and_not_actions() -> None:
    owner = [{"actions": ["*"], "notActions": []}]
    assert checks.missing(checks.GROUP_ACTIONS, owner) == []
    reader = [{"actions": ["*/read"], "notActions": []}]
    assert checks.missing(checks.SUBSCRIPTION_ACTIONS, reader) == []
    assert "Microsoft.Compute/virtualMachines/write" in checks.missing(checks.GROUP_ACTIONS, reader)
    two = [
        {"actions": ["Microsoft.Compute/*"], "notActions": ["*/delete"]},
        {"actions": ["microsoft.compute/disks/delete"]},
    ]  # matching ignores case
    assert checks.granted("Microsoft.Compute/disks/delete", two)
    assert not checks.granted("Microsoft.Compute/virtualMachines/delete", two)
