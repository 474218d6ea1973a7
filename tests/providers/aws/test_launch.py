"""Launching on EC2 (moto in process): what the adapter asks for, and that a request id
buys at most one instance."""

from __future__ import annotations

import base64
from collections.abc import Callable

import pytest

from orchestrator.model import Market, Offer
from providers.aws import TAG_CLUSTER, TAG_JOB, TAG_REQUEST, AwsProvider, client_token
from providers.aws.instances import TAG_GANG
from providers.base import Capability, FailureKind, InstanceState, LaunchSpec

from .conftest import CLUSTER, DLAMI_ID, AwsError, Hooks, Raw

OD = Offer.make_id("aws", "us-east-1a", "p3.2xlarge", Market.ON_DEMAND)
SPOT = Offer.make_id("aws", "us-east-1b", "p3.2xlarge", Market.SPOT)
WEST_SPOT = Offer.make_id("aws", "us-west-2a", "p3.2xlarge", Market.SPOT)


def spec(
    offer: str = OD,
    *,
    job: str = "job-1",
    count: int = 1,
    env: dict[str, str] | None = None,
    cluster: str = CLUSTER,
    entrypoint: tuple[str, ...] = ("python", "train.py", "--resume"),
) -> LaunchSpec:
    return LaunchSpec(
        job_id=job,
        offer_id=offer,
        cluster=cluster,
        count=count,
        entrypoint=entrypoint,
        env=env or {},
        startup_s=120.0,
    )


def user_data(raw: Raw, instance_id: str, region: str = "us-east-1") -> str:
    answer = raw.client("ec2", region).describe_instance_attribute(
        InstanceId=instance_id, Attribute="userData"
    )
    return base64.b64decode(answer["UserData"]["Value"]).decode()


def test_on_demand_launch_is_tagged_imdsv2_in_its_zone(provider: AwsProvider, raw: Raw) -> None:
    outcome = provider.launch(spec(), request_id="req-od-1")

    assert outcome.ok and outcome.error is None
    inst = raw.instance(outcome.instance_id or "")
    assert inst["Placement"]["AvailabilityZone"] == "us-east-1a"
    assert inst["InstanceType"] == "p3.2xlarge"
    assert inst["ImageId"] == DLAMI_ID  # from the Deep Learning AMI's SSM parameter
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert "InstanceLifecycle" not in inst  # on-demand
    assert raw.tags(inst["InstanceId"]) == {
        TAG_CLUSTER: CLUSTER,
        TAG_JOB: "job-1",
        TAG_REQUEST: "req-od-1",
    }
    volumes = raw.client("ec2").describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [inst["InstanceId"]]}]
    )["Volumes"]
    assert volumes
    for volume in volumes:
        assert {t["Key"]: t["Value"] for t in volume.get("Tags", [])}[TAG_CLUSTER] == CLUSTER
    assert outcome.ready_at_s == pytest.approx(inst["LaunchTime"].timestamp() + 120.0)


def test_spot_launch_asks_for_one_time_spot_that_terminates(
    provider: AwsProvider, raw: Raw, hooks: Hooks
) -> None:
    outcome = provider.launch(spec(SPOT), request_id="req-spot-1")

    assert outcome.ok
    inst = raw.instance(outcome.instance_id or "")
    assert inst["InstanceLifecycle"] == "spot"
    assert inst["Placement"]["AvailabilityZone"] == "us-east-1b"
    (params,) = hooks.called("ec2:RunInstances")
    assert params["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    tagged = {s["ResourceType"] for s in params["TagSpecifications"]}
    assert tagged == {"instance", "volume", "spot-instances-request"}
    assert params["ClientToken"] == "req-spot-1"
    assert params["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_on_demand_launch_has_no_market_options(provider: AwsProvider, hooks: Hooks) -> None:
    assert provider.launch(spec(OD), request_id="req-od-2").ok
    (params,) = hooks.called("ec2:RunInstances")
    assert "InstanceMarketOptions" not in params
    assert {s["ResourceType"] for s in params["TagSpecifications"]} == {"instance", "volume"}


def test_same_request_id_buys_one_instance(
    provider: AwsProvider, make_provider: Callable[..., AwsProvider], raw: Raw, hooks: Hooks
) -> None:
    first = provider.launch(spec(SPOT), request_id="req-idem")
    again = provider.launch(spec(SPOT), request_id="req-idem")
    restarted = make_provider().launch(spec(SPOT), request_id="req-idem")  # a new controller

    assert first.instance_id == again.instance_id == restarted.instance_id
    assert raw.count() == 1  # moto ignores ClientToken: the tag lookup is what held
    assert len(hooks.called("ec2:RunInstances")) == 1
    other = provider.launch(spec(SPOT), request_id="req-other")
    assert other.instance_id != first.instance_id and raw.count() == 2


def test_gang_is_rank_0_then_the_others_known_by_its_leader(
    provider: AwsProvider, raw: Raw, hooks: Hooks
) -> None:
    outcome = provider.launch(spec(OD, count=3), request_id="req-gang")
    assert outcome.ok
    assert raw.count() == 3
    first, rest = hooks.called("ec2:RunInstances")
    assert (first["MinCount"], rest["MinCount"]) == (1, 2)
    lead = raw.instance(outcome.instance_id or "")
    assert lead["ClientToken"] == "req-gang" == first["ClientToken"]
    # ranks 1 and 2 are told rank 0's private address (and its id: the gang's) in user data
    assert f"export MASTER_ADDR={lead['PrivateIpAddress']}\n" in rest["UserData"]
    others = [raw.instance(i) for i in gang_ids(raw, "req-gang") if i != outcome.instance_id]
    assert all(raw.tags(o["InstanceId"])[TAG_GANG] == outcome.instance_id for o in others)

    listed = provider.list_instances(cluster=CLUSTER)
    assert list(listed) == [outcome.instance_id]
    assert listed[outcome.instance_id or ""].state in (InstanceState.BOOTING, InstanceState.RUNNING)
    assert listed[outcome.instance_id or ""].offer_id == OD

    provider.terminate([outcome.instance_id or ""], request_id="stop-gang")
    ec2 = raw.client("ec2")
    states = {
        i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]
    }
    assert states <= {"shutting-down", "terminated"}
    assert provider.list_instances(cluster=CLUSTER) == {}


def gang_ids(raw: Raw, request_id: str, *, live: bool = False) -> list[str]:
    answer = raw.client("ec2").describe_instances(
        Filters=[{"Name": f"tag:{TAG_REQUEST}", "Values": [request_id]}]
    )
    return [
        i["InstanceId"]
        for r in answer["Reservations"]
        for i in r["Instances"]
        if not live or i["State"]["Name"] in ("pending", "running")
    ]


def test_a_gang_cut_short_is_terminated_and_its_retry_starts_afresh(
    provider: AwsProvider, raw: Raw, hooks: Hooks
) -> None:
    calls = [0]

    def ranks_find_no_capacity(params: dict[str, object]) -> AwsError | None:
        calls[0] += 1
        return AwsError("InsufficientInstanceCapacity") if calls[0] == 2 else None

    hooks.on("ec2:RunInstances", ranks_find_no_capacity)
    failed = provider.launch(spec(OD, count=3), request_id="req-short")
    assert failed.error is not None and failed.error.kind is FailureKind.CAPACITY
    [rank0] = gang_ids(raw, "req-short")
    assert raw.state(rank0) in ("shutting-down", "terminated")  # rolled back
    assert provider.list_instances(cluster=CLUSTER) == {}
    assert provider.poll_events() == []  # what Heliotrope ended is no preemption

    # the same request again (the controller retries its launch): a new rank 0, a new token
    again = provider.launch(spec(OD, count=3), request_id="req-short")
    assert again.ok and again.instance_id != rank0
    assert len(gang_ids(raw, "req-short", live=True)) == 3
    assert hooks.called("ec2:RunInstances")[2]["ClientToken"] != "req-short"
    assert list(provider.list_instances(cluster=CLUSTER)) == [again.instance_id]


def test_a_launch_interrupted_after_rank_0_is_finished_by_its_retry(
    provider: AwsProvider, raw: Raw, hooks: Hooks
) -> None:
    calls = [0]

    def controller_dies(params: dict[str, object]) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt  # killed between the two calls: nothing rolled back

    hooks.on("ec2:RunInstances", controller_dies)
    with pytest.raises(KeyboardInterrupt):
        provider.launch(spec(OD, count=2), request_id="req-cut")
    [rank0] = gang_ids(raw, "req-cut", live=True)
    restarted = provider.launch(spec(OD, count=2), request_id="req-cut")
    assert restarted.instance_id == rank0  # adopted, not bought again
    assert len(gang_ids(raw, "req-cut", live=True)) == 2 and calls[0] == 3
    assert provider.launch(spec(OD, count=2), request_id="req-cut").instance_id == rank0
    assert calls[0] == 3 and raw.count() == 2


def test_user_data_exports_the_job_environment(provider: AwsProvider, raw: Raw) -> None:
    env = {
        "HELIOTROPE_CHECKPOINT_URI": "s3://heliotrope-ckpt/job-1",
        "TOKENIZERS_PARALLELISM": "false",
        "MESSAGE": "it's here",
    }
    outcome = provider.launch(spec(env=env), request_id="req-env")
    script = user_data(raw, outcome.instance_id or "")

    assert script.startswith("#!/bin/bash")
    assert "export HELIOTROPE_CHECKPOINT_URI=s3://heliotrope-ckpt/job-1" in script
    assert "export TOKENIZERS_PARALLELISM=false" in script  # TOKEN inside a word is fine
    assert "export MESSAGE='it'\"'\"'s here'" in script
    assert "export HELIOTROPE_JOB_ID=job-1" in script
    assert "export HELIOTROPE_NOTICE_SOURCE=aws" in script
    assert "exec python train.py --resume" in script
    assert "X-aws-ec2-metadata-token" in script  # IMDSv2 from the job's side too


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "AWS_SESSION_TOKEN",
        "GITHUB_AUTH",
    ],
)
def test_a_credential_in_the_environment_refuses_the_launch(
    provider: AwsProvider, hooks: Hooks, raw: Raw, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    caplog.set_level("DEBUG", logger="providers.aws")
    outcome = provider.launch(
        spec(env={"SETTING": "1", name: "s3cr3t-value"}), request_id="req-secret"
    )

    assert outcome.error is not None and outcome.error.kind is FailureKind.INVALID
    assert name in outcome.error.message
    assert "s3cr3t-value" not in outcome.error.message + caplog.text
    assert hooks.called("ec2:RunInstances") == [] and raw.count() == 0


def test_user_data_never_reaches_the_log(
    provider: AwsProvider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG", logger="providers.aws")
    provider.launch(spec(env={"SETTING": "visible-only-in-user-data"}), request_id="req-log")
    assert "visible-only-in-user-data" not in caplog.text
    assert "req-log" in caplog.text


def test_ami_parameter_is_read_once_per_region(provider: AwsProvider, hooks: Hooks) -> None:
    provider.launch(spec(OD), request_id="req-a")
    provider.launch(spec(OD), request_id="req-b")
    assert len(hooks.called("ssm:GetParameter")) == 1


def test_explicit_image_and_instance_profile(
    make_provider: Callable[..., AwsProvider], raw: Raw, hooks: Hooks
) -> None:
    iam = raw.client("iam")
    iam.create_role(RoleName="heliotrope-job", AssumeRolePolicyDocument="{}")
    iam.create_instance_profile(InstanceProfileName="heliotrope-job")
    iam.add_role_to_instance_profile(
        InstanceProfileName="heliotrope-job", RoleName="heliotrope-job"
    )
    west_ami = "ami-0f0e0d0c0b0a09081"
    provider = make_provider(
        image_id={"us-east-1": DLAMI_ID, "us-west-2": west_ami}, instance_profile="heliotrope-job"
    )

    outcome = provider.launch(spec(WEST_SPOT), request_id="req-west")

    assert outcome.ok
    inst = raw.instance(outcome.instance_id or "", "us-west-2")
    assert inst["ImageId"] == west_ami
    assert inst["IamInstanceProfile"]["Arn"].endswith("/heliotrope-job")
    assert hooks.called("ssm:GetParameter") == []


@pytest.mark.parametrize(
    ("launch_spec", "request_id", "why"),
    [
        (spec("gcp:europe-west4-a:a2-ultragpu-1g:spot"), "r1", "not an AWS offer id"),
        (spec("aws:us-east-1a:p3.2xlarge:reserved"), "r2", "not an AWS offer id"),
        (spec("aws:eu-west-1a:p3.2xlarge:spot"), "r3", "this provider serves"),
        (spec(cluster="someone-else"), "r4", "sent to cluster"),
        (spec(count=0), "r5", "count must be"),
        (spec(), "", "request id"),
        (spec(entrypoint=()), "r6", "no entrypoint"),
        (spec(env={"BAD NAME": "x"}), "r7", "shell variable"),
        (spec(env={"BIG": "x" * 20_000}), "r8", "over EC2's"),
    ],
)
def test_bad_launches_are_invalid_and_buy_nothing(
    provider: AwsProvider,
    hooks: Hooks,
    raw: Raw,
    launch_spec: LaunchSpec,
    request_id: str,
    why: str,
) -> None:
    outcome = provider.launch(launch_spec, request_id=request_id)
    assert not outcome.ok
    assert outcome.error is not None and outcome.error.kind is FailureKind.INVALID
    assert why in outcome.error.message
    assert hooks.calls == []  # refused before any AWS call
    assert raw.count() == 0


def test_missing_ami_parameter_is_invalid(provider: AwsProvider, hooks: Hooks) -> None:
    hooks.on("ssm:GetParameter", lambda params: None)  # moto: no such public parameter
    outcome = provider.launch(spec(), request_id="req-no-ami")
    assert outcome.error is not None and outcome.error.kind is FailureKind.INVALID
    assert "ParameterNotFound" in outcome.error.message


def test_client_token_fits_ec2() -> None:
    assert client_token("req-1") == "req-1"
    long = client_token("r" * 200)
    assert len(long) <= 64 and long == client_token("r" * 200) != client_token("r" * 201)
    assert client_token("réq").isascii()


def test_capabilities(provider: AwsProvider) -> None:
    assert provider.capabilities() == {
        Capability.SPOT,
        Capability.ON_DEMAND,
        Capability.PREEMPTION_NOTICE,
        Capability.CHECKPOINT_STORE,
        Capability.PRICES,
        Capability.LOGS,
    }
    quotes = provider.quotes()  # what Capability.PRICES promises, with the book's sources
    assert quotes and {k: q.usd_per_hour for k, q in quotes.items()} == provider.prices()


def test_importing_the_package_does_not_import_boto3() -> None:
    import subprocess
    import sys

    code = (
        "import sys, providers.aws, providers.aws.provider; "
        "assert not [m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')]"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_nodes_rank_replaces_ours_not_an_argument_of_the_job() -> None:
    """One user data serves ranks 1..N-1 (each reads its rank from IMDS): only torchrun's
    `--node-rank` is rewritten, never the same text among the job's own arguments."""
    from providers.aws.userdata import render
    from providers.base import LaunchSpec

    spec = LaunchSpec(
        job_id="j",
        offer_id="aws:us-east-1a:p5.48xlarge:spot",
        cluster="c",
        count=3,
        entrypoint=("python", "train.py", "--node-rank=1"),
    )
    script = render(
        spec=spec,
        cluster="c",
        request_id="r",
        region="us-east-1",
        zone="us-east-1a",
        nproc_per_node=8,
        rank0=("i-0", "10.0.0.1"),
    )
    assert "train.py --node-rank=1" in script  # the job's argument, as it was
    assert '--node-rank="${heliotrope_node_rank}" --rdzv-backend' in script  # torchrun's
