"""`GcpProvider.console_output` (`Capability.LOGS`): serial port 1 of a gang's first node,
read only after a `get` shows the instance is ours.

`FakeCompute` is the suite's fake endpoint with `instances.getSerialPortOutput`
(GET .../instances/NAME/serialPort) added: it answers from `recorded/serial_port_output.json`
(a boot and the startup-script runner, in the `SerialPortOutput` shape), or with the text a
test gives an instance, and records the call like every other (the role test reads it).
"""

from __future__ import annotations

import pytest

from orchestrator.errors import InputError, PermanentError, TransientError
from providers.base import Capability, with_logs
from providers.gcp import naming

from .conftest import CLUSTER, OD_A100, PROJECT, Factory, put_foreign_instances, spec
from .fake_compute import Call, FakeCompute, recorded, serial_body

SERIAL_API = "compute.instances.getSerialPortOutput"


def serial_calls(compute: FakeCompute) -> list[Call]:
    return compute.requests_for(SERIAL_API)


def test_serial_port_1_of_an_instance_it_launched(
    make_provider: Factory, compute: FakeCompute
) -> None:
    provider = make_provider()
    reader = with_logs(provider)
    assert reader is not None and Capability.LOGS in provider.capabilities()
    instance_id = provider.launch(spec(), request_id="req-1").instance_id or ""
    zone, name = instance_id.split("/")

    text = make_provider().console_output(instance_id)  # a fresh provider: no memory

    assert text == serial_body(PROJECT, zone, name)["contents"]
    assert text.startswith("[    0.000000] Linux version") and f"{name} google_metadata" in text
    [call] = serial_calls(compute)
    assert call.path == f"/compute/v1/projects/{PROJECT}/zones/{zone}/instances/{name}/serialPort"
    assert call.query["port"] == ["1"]

    compute.serial[(zone, name)] = ""
    assert reader.console_output(instance_id) == ""  # nothing written yet
    compute.serial[(zone, name)] = "step 1 loss 2.31\r\nétape 2 ✓\r\n"
    assert reader.console_output(instance_id) == "step 1 loss 2.31\r\nétape 2 ✓\r\n"


def test_a_gang_is_read_by_its_first_node(make_provider: Factory, compute: FakeCompute) -> None:
    provider = make_provider()
    gang_id = provider.launch(spec(OD_A100, count=2), request_id="req-gang").instance_id or ""
    gang = naming.parse_instance_id(gang_id)
    assert gang is not None and len(gang.members) == 2
    compute.serial[(gang.zone, gang.members[0])] = "rank 0 says hi\n"
    compute.serial[(gang.zone, gang.members[1])] = "rank 1 says hi\n"

    assert provider.console_output(gang_id) == "rank 0 says hi\n"
    [call] = serial_calls(compute)
    assert call.path.endswith(f"/instances/{gang.members[0]}/serialPort")


def test_instances_that_are_not_ours_are_never_read(
    make_provider: Factory, compute: FakeCompute
) -> None:
    foreign = put_foreign_instances(compute)
    ours = make_provider().launch(spec(), request_id="req-1").instance_id or ""
    provider = make_provider()
    for instance_id in (*foreign.values(), "i-0123456789abcdef0"):  # + not a GCP id
        with pytest.raises(InputError, match=f"a live instance of cluster {CLUSTER}"):
            provider.console_output(instance_id)
    with pytest.raises(InputError, match="cluster other-team"):
        make_provider(cluster="other-team").console_output(ours)  # nor ours by another

    assert serial_calls(compute) == []


def test_a_deleted_instance_has_no_console(make_provider: Factory, compute: FakeCompute) -> None:
    provider = make_provider()
    instance_id = provider.launch(spec(), request_id="req-1").instance_id or ""
    zone, name = instance_id.split("/")
    not_found = recorded("error_404_not_found.json", project=PROJECT, zone=zone, instance=name)
    compute.script(SERIAL_API, (404, not_found))  # deleted between the get and the read
    with pytest.raises(InputError, match="deleted"):
        provider.console_output(instance_id)

    provider.terminate([instance_id], request_id="stop")
    with pytest.raises(InputError, match="deleted: its console went with it"):
        provider.console_output(instance_id)
    assert len(serial_calls(compute)) == 1


def test_cloud_failures_are_retried_then_raised(
    make_provider: Factory, compute: FakeCompute, sleeps: list[float]
) -> None:
    provider = make_provider(max_attempts=3)
    instance_id = provider.launch(spec(), request_id="req-1").instance_id or ""
    zone, name = instance_id.split("/")
    compute.serial[(zone, name)] = "ok\n"
    backend = recorded("error_503_backend.json")

    compute.script(SERIAL_API, (503, backend))
    assert provider.console_output(instance_id) == "ok\n"
    assert len(serial_calls(compute)) == 2 and len(sleeps) == 1

    compute.script(SERIAL_API, *[(503, backend)] * 3)
    with pytest.raises(TransientError):
        provider.console_output(instance_id)

    denied = recorded("error_403_permission_denied.json", project=PROJECT, zone=zone, instance=name)
    compute.script(SERIAL_API, (403, denied))
    with pytest.raises(PermanentError):
        provider.console_output(instance_id)
