"""infra/gcp/role.yaml grants exactly the permissions of the API methods the adapter calls.

Every request the adapter sent to the fake endpoint in this session (all GCP tests run
before this file, alphabetically, and this file's own tour of every operation) is mapped
to the IAM permissions Compute Engine checks for it ("Compute Engine IAM permissions"
reference; `instances.insert` by what the body asks for). The role must equal the union.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from providers.gcp import GcpLaunchConfig

from .conftest import CLUSTER, OD_A100, ZONE, Factory, spec
from .fake_compute import ALL_CALLS, Call, FakeCompute

ROLE = Path(__file__).resolve().parents[3] / "infra" / "gcp" / "role.yaml"

# API method -> permissions it always needs.
PERMISSIONS: dict[str, frozenset[str]] = {
    "compute.instances.insert": frozenset({"compute.instances.create"}),
    "compute.instances.get": frozenset({"compute.instances.get"}),
    "compute.instances.delete": frozenset({"compute.instances.delete"}),
    "compute.instances.getSerialPortOutput": frozenset({"compute.instances.getSerialPortOutput"}),
    "compute.instances.list": frozenset({"compute.instances.list"}),
    "compute.instances.aggregatedList": frozenset({"compute.instances.list"}),
    "compute.zoneOperations.get": frozenset({"compute.zoneOperations.get"}),
    "compute.zoneOperations.wait": frozenset({"compute.zoneOperations.get"}),
    "compute.zoneOperations.list": frozenset({"compute.zoneOperations.list"}),
    "compute.machineTypes.list": frozenset({"compute.machineTypes.list"}),
    "cloudbilling.services.skus.list": frozenset(),  # public catalog, read with an API key
}


def insert_permissions(body: dict[str, Any]) -> set[str]:
    """What `instances.insert` additionally checks, by the fields of the instance."""
    needed = set()
    for disk in body.get("disks", []):
        params = disk.get("initializeParams")
        if params is not None:
            needed.add("compute.disks.create")
            if params.get("sourceImage"):
                needed.add("compute.images.useReadOnly")
        if disk.get("source"):
            needed.add("compute.disks.use")
    for nic in body.get("networkInterfaces", []):
        needed.add("compute.subnetworks.use")
        if nic.get("accessConfigs"):
            needed.add("compute.subnetworks.useExternalIp")
    if body.get("labels"):
        needed.add("compute.instances.setLabels")
    if body.get("metadata", {}).get("items"):
        needed.add("compute.instances.setMetadata")
    if body.get("tags", {}).get("items"):
        needed.add("compute.instances.setTags")
    if body.get("serviceAccounts"):
        needed |= {"compute.instances.setServiceAccount", "iam.serviceAccounts.actAs"}
    return needed


def permissions(calls: list[Call]) -> set[str]:
    unknown = {c.api for c in calls} - set(PERMISSIONS)
    assert not unknown, f"map these API methods to permissions: {sorted(unknown)}"
    needed: set[str] = set()
    for call in calls:
        needed |= PERMISSIONS[call.api]
        if call.api == "compute.instances.insert":
            needed |= insert_permissions(call.body)
    return needed


def role() -> dict[str, Any]:
    loaded = yaml.safe_load(ROLE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_role_is_well_formed() -> None:
    spec_ = role()
    assert spec_["title"] and spec_["description"] and spec_["stage"] == "GA"
    granted = spec_["includedPermissions"]
    assert granted == sorted(set(granted)), "keep includedPermissions sorted and unique"
    assert set(spec_) == {"title", "description", "stage", "includedPermissions"}


def test_role_grants_exactly_what_the_adapter_calls(
    make_provider: Factory, compute: FakeCompute
) -> None:
    # a tour of every operation, so this test stands alone too
    provider = make_provider(billing_api_key=compute.billing_key)
    provider.offers()
    provider.prices()
    spot = provider.launch(spec(), request_id="tour-spot").instance_id or ""
    gang = provider.launch(spec(OD_A100, count=2), request_id="tour-od").instance_id or ""
    provider.list_instances(cluster=CLUSTER)
    provider.console_output(spot)
    compute.preempt(ZONE, spot.split("/")[1])
    provider.poll_events()
    provider.terminate([spot, gang], request_id="tour-stop")
    tour = permissions(compute.calls)

    granted = set(role()["includedPermissions"])
    everything = permissions(ALL_CALLS)
    assert tour == everything == granted, (
        f"missing from role.yaml: {sorted(everything - granted)}; "
        f"granted but never used: {sorted(granted - everything)}"
    )


def test_optional_settings_need_permissions_the_role_does_not_grant(
    make_provider: Factory, compute: FakeCompute
) -> None:
    """role.yaml documents these as additions; the default configuration needs none."""
    compute.record_globally = False  # not what the default configuration needs
    config = GcpLaunchConfig(external_ip=True, service_account="job@p.iam.gserviceaccount.com")
    make_provider(launch_config=config).launch(spec(), request_id="opt")
    extra = permissions(compute.calls) - set(role()["includedPermissions"])
    assert extra == {
        "compute.subnetworks.useExternalIp",
        "compute.instances.setServiceAccount",
        "iam.serviceAccounts.actAs",
    }
