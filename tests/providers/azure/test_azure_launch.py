"""Launch through the SDK against the fake ARM: the VM body, idempotency, gangs, failures."""

from __future__ import annotations

import base64

import pytest

from providers.azure import AzureLaunchConfig
from providers.base import FailureKind
from tests.providers.azure.fake_arm import FakeArm
from tests.providers.azure.support import (
    CLUSTER,
    CONFIG,
    OD_A100,
    SPOT_A100,
    SPOT_H100_SE,
    SUBNETS,
    Factory,
    spec,
)

PUT = ("PUT", "Microsoft.Compute/virtualMachines/write")
DELETE = ("DELETE", "Microsoft.Compute/virtualMachines/delete")


def test_spot_vm_is_priority_spot_evicted_by_delete_at_any_price(
    make_provider: Factory, arm: FakeArm
) -> None:
    out = make_provider().launch(
        spec(env={"HELIOTROPE_CHECKPOINT_URI": "s3://b/k"}), request_id="req-1"
    )
    assert out.ok and out.instance_id is not None
    region, name = out.instance_id.split("/")
    assert region == "eastus" and name.startswith("hel-")
    [put] = arm.requests_for(*PUT)
    assert put.path.endswith(f"/virtualMachines/{name}")
    assert {k.lower(): v for k, v in put.headers.items()}["if-none-match"] == "*"
    body = put.body
    props = body["properties"]
    assert body["location"] == "eastus"
    assert props["priority"] == "Spot"
    assert props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": -1}
    assert props["hardwareProfile"] == {"vmSize": "Standard_NC24ads_A100_v4"}
    assert body["tags"] == {
        "heliotrope-cluster": CLUSTER,
        "heliotrope-job": "job-1",
        "heliotrope-request": "req-1",
        "heliotrope-gang": name,
        "heliotrope-startup-s": "600.0",
    }
    # everything the VM brings goes away with it
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    [nic] = props["networkProfile"]["networkInterfaceConfigurations"]
    assert nic["properties"]["deleteOption"] == "Delete"
    ip = nic["properties"]["ipConfigurations"][0]["properties"]
    assert ip["subnet"] == {"id": SUBNETS["eastus"]} and "publicIPAddressConfiguration" not in ip
    linux = props["osProfile"]["linuxConfiguration"]
    assert linux["disablePasswordAuthentication"] is True
    assert "adminPassword" not in props["osProfile"]
    script = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert "export HELIOTROPE_NOTICE_SOURCE=azure" in script
    assert "export HELIOTROPE_CHECKPOINT_URI=s3://b/k" in script
    assert f"export HELIOTROPE_INSTANCE_ID=eastus/{name}" in script
    assert "setsid nohup python train.py" in script


def test_on_demand_vm_is_regular_priority(make_provider: Factory, arm: FakeArm) -> None:
    assert make_provider().launch(spec(OD_A100), request_id="od").ok
    props = arm.requests_for(*PUT)[0].body["properties"]
    assert props["priority"] == "Regular"
    assert "evictionPolicy" not in props and "billingProfile" not in props
    script = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert "HELIOTROPE_NOTICE_SOURCE" not in script


def test_the_same_request_buys_one_vm_even_after_a_restart(
    make_provider: Factory, arm: FakeArm
) -> None:
    first = make_provider().launch(spec(), request_id="req-1")
    again = make_provider().launch(spec(), request_id="req-1")  # a restarted controller
    assert first.instance_id == again.instance_id
    assert len(arm.requests_for(*PUT)) == 1
    other = make_provider().launch(spec(), request_id="req-2")
    assert other.instance_id != first.instance_id
    assert len(arm.requests_for(*PUT)) == 2


def test_a_racing_create_of_the_same_request_is_accepted(
    make_provider: Factory, arm: FakeArm
) -> None:
    provider = make_provider()
    name = provider.launch(spec(), request_id="race").instance_id.split("/")[1]  # type: ignore[union-attr]
    # Another controller's PUT lands between our GET (404) and our PUT: ARM answers 412.
    vm = arm.vms[name]
    arm.vms.clear()
    arm.script(
        "GET",
        "Microsoft.Compute/virtualMachines/read",
        (404, {"error": {"code": "ResourceNotFound", "message": "not yet"}}),
    )
    arm.vms[name] = vm
    out = make_provider().launch(spec(), request_id="race")
    assert out.ok and out.instance_id == f"eastus/{name}"
    assert arm.requests_for(*PUT)[-1].path.endswith(name)  # tried, refused by If-None-Match


def test_a_gang_is_n_vms_with_ranks(make_provider: Factory, arm: FakeArm) -> None:
    out = make_provider().launch(spec(SPOT_H100_SE, count=3), request_id="gang")
    assert out.ok and out.instance_id is not None
    gang = out.instance_id.split("/")[1]
    puts = arm.requests_for(*PUT)
    assert [p.body["name"] if "name" in p.body else p.path.rsplit("/", 1)[1] for p in puts] == [
        f"{gang}-{k}" for k in range(3)
    ]
    scripts = [
        base64.b64decode(p.body["properties"]["osProfile"]["customData"]).decode() for p in puts
    ]
    for rank, script in enumerate(scripts):
        assert f"export HELIOTROPE_NODE_RANK={rank}\n" in script
        assert "export HELIOTROPE_NUM_NODES=3\n" in script
        assert f"export HELIOTROPE_MASTER_ADDR={gang}-0\n" in script
    assert all(p.body["location"] == "swedencentral" for p in puts)


def test_a_vm_of_another_owner_with_our_name_is_never_touched(
    make_provider: Factory, arm: FakeArm
) -> None:
    name = make_provider().launch(spec(), request_id="x").instance_id.split("/")[1]  # type: ignore[union-attr]
    arm.vms.clear()
    arm.add_vm(name, tags={"owner": "alice"})
    out = make_provider().launch(spec(), request_id="x")
    assert out.error is not None and out.error.kind is FailureKind.INVALID
    assert "not touching it" in out.error.message
    assert len(arm.requests_for(*PUT)) == 1 and not arm.requests_for(*DELETE)
    assert arm.vms[name]["tags"] == {"owner": "alice"}


def test_allocation_failure_is_capacity_and_the_failed_vm_is_deleted(
    make_provider: Factory, arm: FakeArm
) -> None:
    arm.failing_creates.append("error_allocation_failed.json")
    out = make_provider().launch(spec(), request_id="full")
    assert out.error is not None and out.error.kind is FailureKind.CAPACITY
    assert "AllocationFailed" in out.error.message
    assert len(arm.requests_for(*DELETE)) == 1  # ARM keeps a Failed VM: we delete it
    assert arm.vms == {}


def test_a_gang_that_fails_half_way_leaves_nothing(make_provider: Factory, arm: FakeArm) -> None:
    arm.failing_creates.extend([None, "error_allocation_failed.json"])
    out = make_provider().launch(spec(count=2), request_id="half")
    assert out.error is not None and out.error.kind is FailureKind.CAPACITY
    assert len(arm.requests_for(*DELETE)) == 2
    assert arm.vms == {}


@pytest.mark.parametrize(
    ("status", "fixture", "kind"),
    [
        (409, "error_quota.json", FailureKind.QUOTA),
        (403, "error_authorization_failed.json", FailureKind.AUTH),
        (400, "error_invalid_parameter.json", FailureKind.INVALID),
    ],
)
def test_refused_creates_come_back_as_data(
    make_provider: Factory,
    arm: FakeArm,
    sleeps: list[float],
    status: int,
    fixture: str,
    kind: FailureKind,
) -> None:
    from tests.providers.azure.fake_arm import recorded

    arm.script(*PUT, (status, recorded(fixture, subscription="s", resource_group="rg", name="n")))
    out = make_provider().launch(spec(), request_id="refused")
    assert out.error is not None and out.error.kind is kind
    assert sleeps == []  # never retried
    assert arm.vms == {}


def test_throttling_is_retried_with_the_injected_sleep(
    make_provider: Factory, arm: FakeArm, sleeps: list[float]
) -> None:
    from tests.providers.azure.fake_arm import recorded

    arm.script(
        *PUT,
        (429, recorded("error_throttled.json")),
        (503, {"error": {"code": "ServiceUnavailable", "message": "try later"}}),
    )
    out = make_provider().launch(spec(), request_id="busy")
    assert out.ok
    assert len(sleeps) == 2 and len(arm.requests_for(*PUT)) == 3


def test_throttling_that_does_not_end_is_transient_with_retry_after(
    make_provider: Factory, arm: FakeArm
) -> None:
    from tests.providers.azure.fake_arm import recorded

    arm.script(*PUT, *[(429, recorded("error_throttled.json"))] * 5)
    out = make_provider(max_attempts=2).launch(spec(), request_id="busy")
    assert out.error is not None and out.error.kind is FailureKind.TRANSIENT
    assert out.error.retry_after_s == 7.0  # ARM's Retry-After


@pytest.mark.parametrize(
    ("changes", "offer", "env", "why"),
    [
        ({}, "azure:westus:Standard_NC24ads_A100_v4:spot", {}, "region westus is not one of"),
        ({}, "azure:eastus:Standard_D4s_v5:spot", {}, "not a GPU VM size"),
        ({}, "azure:eastus:Standard_NC24ads_A100_v4:reserved", {}, "market 'reserved'"),
        ({}, "gcp:eastus:x:spot", {}, "expected azure:<region>"),
        ({"subnet_ids": {}}, SPOT_A100, {}, "subnet_ids['eastus']"),
        ({"ssh_public_key": ""}, SPOT_A100, {}, "ssh_public_key"),
        ({"image": "ubuntu"}, SPOT_A100, {}, "publisher:offer:sku:version"),
        ({}, SPOT_A100, {"HF_TOKEN": "hf_x"}, "HF_TOKEN"),
        ({}, SPOT_A100, {"AZURE_CLIENT_SECRET": "x"}, "AZURE_CLIENT_SECRET"),
    ],
)
def test_bad_launches_are_refused_before_any_call(
    make_provider: Factory,
    arm: FakeArm,
    changes: dict[str, object],
    offer: str,
    env: dict[str, str],
    why: str,
) -> None:
    fields = {f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}
    config = AzureLaunchConfig(**{**fields, **changes})  # type: ignore[arg-type]
    out = make_provider(launch_config=config).launch(spec(offer, env=env), request_id="bad")
    assert out.error is not None and out.error.kind is FailureKind.INVALID
    assert why in out.error.message
    assert arm.calls == []


def test_a_spec_for_another_cluster_is_refused(make_provider: Factory, arm: FakeArm) -> None:
    out = make_provider().launch(spec(cluster="other"), request_id="c")
    assert out.error is not None and "this provider serves 'ml-prod'" in out.error.message
    assert arm.calls == []


def test_a_managed_identity_is_attached_when_configured(
    make_provider: Factory, arm: FakeArm
) -> None:
    arm.record_globally = False  # not what the default configuration needs
    identity = (
        "/subscriptions/s/resourceGroups/rg/providers/"
        "Microsoft.ManagedIdentity/userAssignedIdentities/heliotrope-job"
    )
    fields = {f: getattr(CONFIG, f) for f in CONFIG.__dataclass_fields__}
    config = AzureLaunchConfig(**{**fields, "managed_identity": identity})  # type: ignore[arg-type]
    assert make_provider(launch_config=config).launch(spec(), request_id="mi").ok
    body = arm.requests_for(*PUT)[0].body
    assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {identity: {}}}


def test_a_failed_first_member_waits_for_the_others_before_rolling_back(
    make_provider: Factory, arm: FakeArm
) -> None:
    arm.failing_creates.extend(["error_allocation_failed.json", None, None])
    out = make_provider().launch(spec(count=3), request_id="first")
    assert out.error is not None and out.error.kind is FailureKind.CAPACITY
    kinds = [
        c.method for c in arm.calls if c.method == "DELETE" or c.action.endswith("operations/read")
    ]
    first_delete = kinds.index("DELETE")
    assert kinds[:first_delete] == ["GET"] * 3  # all three creates finished first
    assert len(arm.requests_for(*DELETE)) == 3 and arm.vms == {}
