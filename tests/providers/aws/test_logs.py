"""`AwsProvider.console_output` (`Capability.LOGS`): an instance's EC2 console output,
read only for instances of this cluster.

moto answers `GetConsoleOutput` with a fixed sample; the hooks answer it at the API layer
where a test needs its own text (base64, as EC2 sends it), no output yet, or an error.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest

from orchestrator.errors import InputError, TransientError
from orchestrator.model import Market, Offer
from providers.aws import TAG_CLUSTER, TAG_JOB, TAG_REQUEST, AwsProvider
from providers.base import Capability, LaunchSpec, with_logs

from .conftest import CLUSTER, AwsError, Hooks, Raw

OD = Offer.make_id("aws", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
MOTO_FIRST_LINE = "Linux version 2.6.16-xenU"  # moto's sample console output starts so


def spec(count: int = 1) -> LaunchSpec:
    return LaunchSpec(
        job_id="job-1", offer_id=OD, cluster=CLUSTER, entrypoint=("train",), count=count
    )


def console(text: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Answer `GetConsoleOutput` with `text`, base64 as EC2 sends it."""

    def answer(params: dict[str, Any]) -> dict[str, Any]:
        return {
            "InstanceId": params["InstanceId"],
            "Output": base64.b64encode(text.encode()).decode(),
        }

    return answer


def test_the_console_of_an_instance_it_launched(provider: AwsProvider, hooks: Hooks) -> None:
    reader = with_logs(provider)
    assert reader is not None and Capability.LOGS in provider.capabilities()
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""

    text = reader.console_output(ours)

    assert text.startswith(MOTO_FIRST_LINE) and text.endswith("done.\n")  # decoded
    [call] = hooks.called("ec2:GetConsoleOutput")
    assert call["InstanceId"] == ours and call["Latest"] is True and call["_region"] == "us-east-1"


def test_the_text_as_the_instance_wrote_it_and_none_yet(
    provider: AwsProvider, hooks: Hooks
) -> None:
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""
    hooks.on("ec2:GetConsoleOutput", console("step 1 loss 2.31\nétape 2 ✓\r\n"))
    assert provider.console_output(ours) == "step 1 loss 2.31\nétape 2 ✓\r\n"
    hooks.on("ec2:GetConsoleOutput", lambda params: {"InstanceId": params["InstanceId"]})
    assert provider.console_output(ours) == ""  # booting: EC2 has no output yet


def test_instances_that_are_not_ours_are_never_read(
    provider: AwsProvider, make_provider: Callable[..., AwsProvider], raw: Raw, hooks: Hooks
) -> None:
    foreign = [
        raw.run()[0],  # untagged
        raw.run(tags={TAG_CLUSTER: "other", TAG_JOB: "job-1", TAG_REQUEST: "req-1"})[0],
        raw.run(tags={TAG_CLUSTER: f"{CLUSTER}-2"})[0],  # a look-alike cluster name
        raw.run(tags={TAG_CLUSTER: "other"}, region="us-west-2", zone="us-west-2a")[0],
        "i-00000000000000000",  # no such instance
    ]
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""
    for instance_id in foreign:
        with pytest.raises(InputError, match=f"an instance of cluster {CLUSTER} in"):
            provider.console_output(instance_id)
    with pytest.raises(InputError, match="cluster other"):
        make_provider(cluster="other").console_output(ours)  # nor ours by another cluster

    assert hooks.called("ec2:GetConsoleOutput") == []
    for params in hooks.called("ec2:DescribeInstances"):
        assert {"Name": f"tag:{TAG_CLUSTER}", "Values": [params["Filters"][0]["Values"][0]]} in (
            params["Filters"]
        )


def test_a_gang_is_read_by_its_leader_rank_0(provider: AwsProvider, hooks: Hooks) -> None:
    lead = provider.launch(spec(count=3), request_id="req-gang").instance_id or ""

    assert provider.console_output(lead).startswith(MOTO_FIRST_LINE)
    assert [c["InstanceId"] for c in hooks.called("ec2:GetConsoleOutput")] == [lead]


def test_older_instances_without_latest_and_throttling(provider: AwsProvider, hooks: Hooks) -> None:
    ours = provider.launch(spec(), request_id="req-1").instance_id or ""
    answers = console("what EC2 last captured\n")

    def latest_unsupported(params: dict[str, Any]) -> Any:
        if params.get("Latest"):  # Latest=True: Nitro instances only
            return AwsError("UnsupportedOperation", "Latest is not supported for this instance")
        return answers(params)

    hooks.on("ec2:GetConsoleOutput", latest_unsupported)
    assert provider.console_output(ours) == "what EC2 last captured\n"
    assert [c.get("Latest") for c in hooks.called("ec2:GetConsoleOutput")] == [True, None]

    hooks.fail("ec2:GetConsoleOutput", "RequestLimitExceeded", times=2)
    assert provider.console_output(ours).startswith(MOTO_FIRST_LINE)  # retried, then moto's

    hooks.fail("ec2:GetConsoleOutput", "RequestLimitExceeded")
    with pytest.raises(TransientError):
        provider.console_output(ours)
