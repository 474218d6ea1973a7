"""infra/azure/role.json and role-subscription.json grant exactly the actions the adapter uses.

Every request the adapter sent to the fake ARM in this session (the Azure tests before this
file, alphabetically, and this file's own tour of every operation) is mapped to the RBAC
actions ARM checks for it: the operation's own action, plus the linked-access checks the
body triggers (a VM that creates its NIC and OS disk needs to write them and join the
subnet; a delete with `deleteOption: Delete` deletes them too). Requests to
`/subscriptions/<id>/providers/...` are checked at subscription scope, the rest in the
resource group, so each action must be in the role of its scope, and nothing more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from providers.azure import checks
from tests.providers.azure.fake_arm import ALL_CALLS, Call, FakeArm
from tests.providers.azure.support import CLUSTER, CONFIG, OD_A100, Factory, spec

INFRA = Path(__file__).resolve().parents[3] / "infra" / "azure"
ROLE = INFRA / "role.json"
SUBSCRIPTION_ROLE = INFRA / "role-subscription.json"

# A delete of a VM whose NIC and OS disk have deleteOption Delete (ours always do; see
# test_azure_launch) deletes them as the caller.
DELETE_LINKED = frozenset(
    {"Microsoft.Network/networkInterfaces/delete", "Microsoft.Compute/disks/delete"}
)


def create_linked(body: dict[str, Any]) -> set[str]:
    """The linked-access actions a VM PUT needs, by the fields of the VM."""
    props = body.get("properties", {})
    needed: set[str] = set()
    for nic in props.get("networkProfile", {}).get("networkInterfaceConfigurations", []):
        needed |= {
            "Microsoft.Network/networkInterfaces/write",
            "Microsoft.Network/networkInterfaces/join/action",
        }
        for ip in nic.get("properties", {}).get("ipConfigurations", []):
            if ip.get("properties", {}).get("subnet"):
                needed.add("Microsoft.Network/virtualNetworks/subnets/join/action")
            if ip.get("properties", {}).get("publicIPAddressConfiguration"):
                needed |= {
                    "Microsoft.Network/publicIPAddresses/write",
                    "Microsoft.Network/publicIPAddresses/join/action",
                }
    for ref in props.get("networkProfile", {}).get("networkInterfaces", []):
        if ref.get("id"):
            needed.add("Microsoft.Network/networkInterfaces/join/action")
    os_disk = props.get("storageProfile", {}).get("osDisk", {})
    if os_disk.get("createOption") == "FromImage" and "managedDisk" in os_disk:
        needed.add("Microsoft.Compute/disks/write")
    if body.get("identity", {}).get("userAssignedIdentities"):
        needed.add("Microsoft.ManagedIdentity/userAssignedIdentities/assign/action")
    return needed


def actions(calls: list[Call]) -> tuple[set[str], set[str]]:
    """(resource-group actions, subscription actions) the calls need."""
    group: set[str] = set()
    subscription: set[str] = set()
    for call in calls:
        if call.action in ("retail-prices", "self-permissions"):
            continue  # the public price list, and the caller's own permissions: no RBAC
        needed = {call.action}
        if call.method == "PUT":
            needed |= create_linked(call.body)
        if call.method == "DELETE":
            needed |= DELETE_LINKED
        scoped_to_group = "/resourceGroups/" in call.path
        (group if scoped_to_group else subscription).update(needed)
    return group, subscription


def role(path: Path) -> dict[str, Any]:
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_roles_are_well_formed() -> None:
    for path in (ROLE, SUBSCRIPTION_ROLE):
        spec_ = role(path)
        assert set(spec_) == {
            "Name",
            "IsCustom",
            "Description",
            "Actions",
            "NotActions",
            "DataActions",
            "NotDataActions",
            "AssignableScopes",
        }
        assert spec_["IsCustom"] is True and spec_["Name"] and spec_["Description"]
        assert spec_["Actions"] == sorted(set(spec_["Actions"])), "keep Actions sorted, unique"
        assert not any("*" in a for a in spec_["Actions"]), "no wildcards"
        assert spec_["NotActions"] == spec_["DataActions"] == spec_["NotDataActions"] == []
    assert all("/resourceGroups/" in s for s in role(ROLE)["AssignableScopes"])
    assert all("/resourceGroups/" not in s for s in role(SUBSCRIPTION_ROLE)["AssignableScopes"])


def test_roles_grant_exactly_what_the_adapter_calls(make_provider: Factory, arm: FakeArm) -> None:
    provider = make_provider()  # a tour of every operation, so this test stands alone too
    provider.offers()
    provider.prices()
    spot = provider.launch(spec(), request_id="tour-spot").instance_id or ""
    gang = provider.launch(spec(OD_A100, count=2), request_id="tour-od").instance_id or ""
    provider.list_instances(cluster=CLUSTER)
    arm.evict(spot.split("/")[1])
    provider.poll_events()
    provider.terminate([spot, gang], request_id="tour-stop")
    tour = actions(arm.calls)

    everything = actions(ALL_CALLS)
    granted = (set(role(ROLE)["Actions"]), set(role(SUBSCRIPTION_ROLE)["Actions"]))
    assert tour == everything == granted, (
        f"needed in the resource group: {sorted(everything[0])}, granted {sorted(granted[0])}; "
        f"needed at the subscription: {sorted(everything[1])}, granted {sorted(granted[1])}"
    )


def test_a_managed_identity_needs_an_action_the_role_does_not_grant(
    make_provider: Factory, arm: FakeArm
) -> None:
    """docs/providers.md documents it as an addition; the default configuration needs none."""
    arm.record_globally = False
    fields = {f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}
    fields["managed_identity"] = (
        "/subscriptions/s/resourceGroups/rg/providers/"
        "Microsoft.ManagedIdentity/userAssignedIdentities/job"
    )
    from providers.azure import AzureLaunchConfig

    make_provider(launch_config=AzureLaunchConfig(**fields)).launch(spec(), request_id="mi")
    extra = actions(arm.calls)[0] - set(role(ROLE)["Actions"])
    assert extra == {"Microsoft.ManagedIdentity/userAssignedIdentities/assign/action"}


def test_the_checks_ask_for_exactly_the_roles_actions() -> None:
    """`providers check` compares effective permissions with these sets (no file at run time)."""
    assert set(role(ROLE)["Actions"]) == checks.GROUP_ACTIONS
    assert set(role(SUBSCRIPTION_ROLE)["Actions"]) == checks.SUBSCRIPTION_ACTIONS
