"""`heliotrope providers check` and `heliotrope offers` against moto and the recorded GCP
endpoint, through the CLI and the standard credential chains (fake credentials only)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from orchestrator.cli import main
from orchestrator.live.clouds import make_providers
from orchestrator.signals.traces import Trace, empty_frame, make_manifest, write_trace
from providers.base import LaunchSpec
from tests.providers.conftest import (
    AWS_KEY_ID,
    AWS_SECRET,
    AWS_SPOT_L4,
    BILLING_KEY,
    CLUSTER,
    GCP_SPOT_L4,
    PROJECT,
    CloudFakes,
)
from tests.providers.gcp.fake_compute import recorded

SECRETS = (AWS_SECRET, AWS_KEY_ID, BILLING_KEY)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    for secret in SECRETS:
        assert secret not in out and secret not in err, "a secret was printed"
    return code, (json.loads(out) if "--json" in argv else out), err


def results(rows: list[dict[str, str]]) -> dict[tuple[str, str], str]:
    return {(r["provider"], r["check"]): r["result"] for r in rows}


def launch_aws(fakes: CloudFakes) -> str:
    """An instance of the cluster, as the controller would have launched it."""
    [provider] = make_providers(
        fakes.settings(), clock=_clock(), access=fakes.access(), clouds=["aws"]
    ).values()
    outcome = provider.launch(
        LaunchSpec(job_id="job-1", offer_id=AWS_SPOT_L4, cluster=CLUSTER, entrypoint=("train",)),
        request_id="req-1",
    )
    assert outcome.instance_id is not None
    return outcome.instance_id


def _clock() -> Any:
    from orchestrator.clock import SystemClock

    return SystemClock()


def test_check_passes_with_dry_runs_and_prints_no_secret(
    cloud_fakes: CloudFakes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    instance_id = launch_aws(cloud_fakes)
    runs_before = len(cloud_fakes.aws_ops("ec2:RunInstances"))
    cloud_fakes.use_standard_credential_chains(monkeypatch)
    config = cloud_fakes.write_settings()

    code, rows, _ = run_cli(capsys, "providers", "check", "--config", str(config), "--json")

    assert code == 0, rows
    got = results(rows)
    assert got[("aws", "sts:GetCallerIdentity")] == "ok"
    assert got[("aws", "ec2:DescribeInstances")] == "ok"
    assert got[("aws", "pricing:GetProducts")] == "ok"
    assert got[("aws", "ec2:RunInstances dry run us-east-1")] == "ok"
    assert got[("aws", "ec2:RunInstances dry run us-west-2")] == "ok"
    assert got[("aws", "ec2:TerminateInstances dry run us-east-1")] == "ok"
    assert got[("aws", "ec2:TerminateInstances dry run us-west-2")] == "skip"  # nothing there
    assert got[("gcp", "credentials")] == "ok"
    for check in (
        "compute.machineTypes.list",
        "compute.instances.list",
        "compute.zoneOperations.list",
        "cloudbilling.services.skus.list",
    ):
        assert got[("gcp", check)] == "ok", check
    assert got[("gcp", "compute.instances.create")] == "skip"  # no dry run on Compute Engine
    reasons = {r["check"]: r["reason"] for r in rows}
    assert "123456789012" in reasons["sts:GetCallerIdentity"]  # moto's account: not a secret
    assert instance_id in reasons["ec2:TerminateInstances dry run us-east-1"]

    # Only dry runs: nothing was bought or ended, and the dry run is exactly a launch's request.
    runs = cloud_fakes.aws_ops("ec2:RunInstances")[runs_before:]
    assert len(runs) == 2 and all(r["DryRun"] is True for r in runs)
    east = next(r for r in runs if r["_region"] == "us-east-1")
    assert east["InstanceType"] == "g6.xlarge"  # the cheapest spot offer there
    assert east["InstanceMarketOptions"]["MarketType"] == "spot"
    assert east["MetadataOptions"]["HttpTokens"] == "required"
    tags = {t["Key"]: t["Value"] for t in east["TagSpecifications"][0]["Tags"]}
    assert tags["heliotrope:cluster"] == CLUSTER
    [terminate] = cloud_fakes.aws_ops("ec2:TerminateInstances")
    assert terminate["DryRun"] is True and terminate["InstanceIds"] == [instance_id]
    assert cloud_fakes.raw.state(instance_id) == "running"
    assert cloud_fakes.raw.count() + cloud_fakes.raw.count("us-west-2") == 1
    assert not cloud_fakes.gcp_ops("compute.instances.insert")
    assert not cloud_fakes.gcp_ops("compute.instances.delete")


def test_check_fails_with_the_reason_and_exit_1(
    cloud_fakes: CloudFakes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud_fakes.use_standard_credential_chains(monkeypatch)
    cloud_fakes.hooks.fail("ec2:RunInstances", "UnauthorizedOperation")
    cloud_fakes.compute.script(
        "compute.machineTypes.list",
        (
            403,
            recorded(
                "error_403_permission_denied.json",
                project=PROJECT,
                zone="us-central1-a",
                instance="x",
            ),
        ),
    )
    config = cloud_fakes.write_settings()

    code, rows, _ = run_cli(capsys, "providers", "check", "--config", str(config), "--json")

    assert code == 1
    got = results(rows)
    assert got[("aws", "ec2:RunInstances dry run us-east-1")] == "fail"
    assert got[("gcp", "compute.machineTypes.list")] == "fail"
    assert got[("aws", "sts:GetCallerIdentity")] == "ok"
    reasons = {(r["provider"], r["check"]): r["reason"] for r in rows}
    assert "UnauthorizedOperation" in reasons[("aws", "ec2:RunInstances dry run us-east-1")]
    assert "compute.machineTypes.list" in reasons[("gcp", "compute.machineTypes.list")] or (
        "permission" in reasons[("gcp", "compute.machineTypes.list")].lower()
    )

    # the table form says the same, for one cloud only
    code, text, _ = run_cli(capsys, "providers", "check", "--config", str(config), "--cloud", "aws")
    assert code == 1 and "fail" in text and "gcp" not in text


def test_check_without_credentials(
    cloud_fakes: CloudFakes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    cloud_fakes.use_standard_credential_chains(monkeypatch)
    cloud_fakes.hooks.fail("sts:GetCallerIdentity", "InvalidClientTokenId", status=403)

    def no_adc(*args: object, **kwargs: object) -> None:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    config = cloud_fakes.write_settings()

    code, rows, _ = run_cli(capsys, "providers", "check", "--config", str(config), "--json")

    assert code == 1
    assert [(r["provider"], r["check"], r["result"]) for r in rows] == [
        ("aws", "sts:GetCallerIdentity", "fail"),
        ("aws", "ec2 and pricing", "skip"),
        ("gcp", "credentials", "fail"),
        ("gcp", "compute", "skip"),
    ]
    assert "InvalidClientTokenId" in rows[0]["reason"]
    assert not cloud_fakes.aws_ops("ec2:RunInstances")


def test_check_refuses_an_unknown_cloud(
    cloud_fakes: CloudFakes, capsys: pytest.CaptureFixture[str]
) -> None:
    config = cloud_fakes.write_settings(providers=["gcp"])
    code, _, err = run_cli(capsys, "providers", "check", "--config", str(config), "--cloud", "aws")
    assert code == 2 and "--cloud" in err


def carbon_trace(path: Path, *, hour: datetime) -> Path:
    """A trace with one hourly carbon sample for AWS us-east-1's grid zone (PJM)."""
    grid = pd.DataFrame(
        [
            {
                "time": hour,
                "grid_zone": "US-MIDA-PJM",
                "metric": "carbon_avg_g_per_kwh",
                "value": 321.0,
                "source": "test",
            }
        ]
    )
    trace = Trace(
        offers=empty_frame("offers"),
        prices=empty_frame("prices"),
        spot=empty_frame("spot"),
        grid=grid,
        manifest=make_manifest(generator="test"),
    )
    return write_trace(trace, path)


def test_offers_across_clouds_cheapest_first_with_carbon(
    cloud_fakes: CloudFakes, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cloud_fakes.use_standard_credential_chains(monkeypatch)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    config = cloud_fakes.write_settings(traces=str(carbon_trace(cloud_fakes.tmp / "t", hour=hour)))

    code, rows, _ = run_cli(
        capsys, "offers", "--config", str(config), "--gpu", "L4", "--market", "spot", "--json"
    )

    assert code == 0
    assert {r["gpu"] for r in rows} == {"L4"} and {r["market"] for r in rows} == {"spot"}
    assert {r["cloud"] for r in rows} == {"aws", "gcp"}
    costs = [r["usd_per_gpu_hour"] for r in rows]
    assert costs == sorted(costs)
    ids = [f"{r['cloud']}:{r['zone']}:{r['instance_type']}:{r['market']}" for r in rows]
    assert ids[:2] == [AWS_SPOT_L4, GCP_SPOT_L4]
    first, second = rows[0], rows[1]
    assert first["usd_per_hour"] == 0.2 and first["price_source"] == "ec2:DescribeSpotPriceHistory"
    assert second["price_source"] == "billing-catalog"
    # carbon: the trace's hourly value where it has one, else the yearly average, saying which
    assert first["g_co2_per_kwh"] == 321.0 and first["carbon_source"].startswith("hourly")
    assert second["grid_zone"] == "US-MIDW-MISO"
    assert second["carbon_source"].startswith("yearly average")
    assert "scenario" in second["carbon_source"] and second["g_co2_per_kwh"] > 0
    big = next(r for r in rows if r["instance_type"] == "g2-standard-48")
    assert big["gpus"] == 4 and big["usd_per_gpu_hour"] == pytest.approx(
        big["usd_per_hour"] / 4, abs=1e-4
    )

    # `--gpu A100` means both A100 sizes; `--cloud gcp` asks AWS nothing
    calls = len(cloud_fakes.hooks.calls)
    code, rows, _ = run_cli(
        capsys, "offers", "--config", str(config), "--gpu", "A100", "--cloud", "gcp", "--json"
    )
    assert code == 0 and {r["gpu"] for r in rows} == {"A100-40GB", "A100-80GB"}
    assert {r["cloud"] for r in rows} == {"gcp"}
    assert len(cloud_fakes.hooks.calls) == calls

    # the table form
    code, text, _ = run_cli(
        capsys, "offers", "--config", str(config), "--gpu", "L4", "--market", "spot"
    )
    assert code == 0 and "g6.xlarge" in text and "g2-standard-4" in text


def test_offers_refuses_an_unknown_gpu(
    cloud_fakes: CloudFakes, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "offers", "--config", str(cloud_fakes.write_settings()), "--gpu", "Z9000"
    )
    assert code == 2 and "--gpu" in err
