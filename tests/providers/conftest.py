"""Fixtures shared by the multi-cloud tests (here, and tests/e2e/test_multicloud.py, which
imports `open_cloud_fakes`): AWS through moto in process with the AWS suite's botocore
hooks, GCP through the GCP suite's recorded-response Compute Engine endpoint.

The AWS and GCP suites' helpers are imported under their package paths
(`tests.providers.aws.conftest`, `tests.providers.gcp.fake_compute`): module objects of
their own, so nothing done here is recorded into the least-privilege tests' call logs
(`RECORDED`, `ALL_CALLS`) -- those check the adapters, not `providers check`, whose
`sts:GetCallerIdentity` needs no permission at all. The fake endpoint is also started with
`record_globally=False`.

World: cluster `multi`; AWS in us-east-1 and us-west-2 with one spot offer only, L4
`g6.xlarge` in us-east-1a at 0.20 $/h (cheaper than any GCP spot L4); GCP in us-central1-a
(L4 spot 0.28 $/h from the recorded Cloud Billing Catalog) and europe-west4-a.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.live.clouds import CloudAccess, CloudSettings
from providers.gcp.naming import label_value
from tests.providers.aws.conftest import (
    Hooks,
    Raw,
    dlami_parameter,
    new_session,
    pricing_products,
    spot_price_history,
)
from tests.providers.gcp.fake_compute import FakeCompute

CLUSTER = "multi"
PROJECT = "heliotrope-test"
AWS_REGIONS = ("us-east-1", "us-west-2")
GCP_ZONES = ("us-central1-a", "europe-west4-a")
AWS_SPOT_USD = {("us-east-1a", "g6.xlarge"): 0.20}
AWS_SPOT_L4 = "aws:us-east-1a:g6.xlarge:spot"
GCP_SPOT_L4 = "gcp:us-central1-a:g2-standard-4:spot"
BILLING_ENV = "HELIOTROPE_TEST_BILLING_KEY"
BILLING_KEY = "test-billing-key"  # what the fake Cloud Billing endpoint accepts
# Fake credentials that look like real ones: no output may contain them.
AWS_KEY_ID = "AKIAHELIOTROPETEST01"
AWS_SECRET = "hElIoTrOpE/fake+secret/0123456789abcdefGHIJ"


def capture_params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
    """Keep the API parameters where `Hooks.dispatch` reads them (without recording them
    for the AWS suite's least-privilege test, as `Hooks.record` would)."""
    context["heliotrope_test_params"] = dict(params)


@dataclass
class CloudFakes:
    hooks: Hooks
    compute: FakeCompute
    raw: Raw
    tmp: Path

    def aws_session(self) -> Any:
        session = new_session()
        session.events.register_first("provide-client-params", capture_params)
        session.events.register("before-call", self.hooks.dispatch)
        return session

    def access(self, sleep: Callable[[float], None] | None = None) -> CloudAccess:
        from google.auth.credentials import AnonymousCredentials

        from providers.aws.spec import AwsAccess
        from providers.gcp.spec import GcpAccess

        return CloudAccess(
            {
                "aws": AwsAccess(session_factory=self.aws_session),
                "gcp": GcpAccess(credentials=AnonymousCredentials()),
            },
            sleep=sleep or (lambda s: None),
        )

    def settings_doc(self, **overrides: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "cluster": CLUSTER,
            "providers": ["aws", "gcp"],
            "aws": {"regions": list(AWS_REGIONS)},
            "gcp": {
                "project": PROJECT,
                "zones": list(GCP_ZONES),
                "billing_api_key_env": BILLING_ENV,
                "api_endpoint": self.compute.url,
                "billing_endpoint": self.compute.url,
            },
            "checkpoints": {"default": f"file://{self.tmp}/checkpoints/{{cloud}}/{{region}}"},
            "policy": "spot-failover",
        }
        doc.update(overrides)
        return doc

    def settings(self, **overrides: Any) -> CloudSettings:
        return CloudSettings.model_validate(self.settings_doc(**overrides))

    def write_settings(self, **overrides: Any) -> Path:
        path = self.tmp / "clouds.yaml"
        path.write_text(yaml.safe_dump(self.settings_doc(**overrides)))
        return path

    def aws_ops(self, operation: str, *, dry_run: bool | None = None) -> list[dict[str, Any]]:
        """AWS API calls the code under test made (the setup's `raw` calls are not seen)."""
        calls = self.hooks.called(operation)
        if dry_run is None:
            return calls
        return [c for c in calls if bool(c.get("DryRun")) is dry_run]

    def gcp_ops(self, api: str) -> list[Any]:
        return self.compute.requests_for(api)

    def use_standard_credential_chains(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """For code that builds its own clients from the default chains (the CLI): every new
        botocore session gets the hooks (as moto's own handler is installed), and
        Application Default Credentials are anonymous."""
        import botocore.handlers
        import google.auth
        from google.auth.credentials import AnonymousCredentials

        monkeypatch.setattr(
            botocore.handlers,
            "BUILTIN_HANDLERS",
            [
                *botocore.handlers.BUILTIN_HANDLERS,
                ("provide-client-params", capture_params),
                ("before-call", self.hooks.dispatch),
            ],
        )
        monkeypatch.setattr(
            google.auth, "default", lambda *a, **k: (AnonymousCredentials(), PROJECT)
        )

    def answer_spot_reclaimed(self, instance_id: str, *, job_id: str, request_id: str) -> None:
        """From now on EC2 says AWS took the spot instance back (the status codes moto does
        not model), in the shape `DescribeSpotInstanceRequests` returns."""
        from providers.aws import TAG_CLUSTER, TAG_JOB, TAG_REQUEST

        entry = {
            "SpotInstanceRequestId": "sir-reclaimed1",
            "State": "closed",
            "Type": "one-time",
            "Status": {
                "Code": "instance-terminated-by-price",
                "Message": "Your Spot Instance was terminated because the Spot price "
                "rose above your maximum price.",
                "UpdateTime": datetime.now(UTC),
            },
            "InstanceId": instance_id,
            "LaunchedAvailabilityZone": "us-east-1a",
            "ProductDescription": "Linux/UNIX",
            "InstanceInterruptionBehavior": "terminate",
            "Tags": [
                {"Key": TAG_CLUSTER, "Value": CLUSTER},
                {"Key": TAG_JOB, "Value": job_id},
                {"Key": TAG_REQUEST, "Value": request_id},
            ],
        }
        self.hooks.on(
            "ec2:DescribeSpotInstanceRequests", lambda params: {"SpotInstanceRequests": [entry]}
        )


@contextlib.contextmanager
def open_cloud_fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CloudFakes]:
    """moto (in process) and the fake Compute Engine endpoint, with fake credentials only."""
    from moto import mock_aws

    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ENDPOINT_URL",
        "HELIOTROPE_DB_URL",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    monkeypatch.setenv(BILLING_ENV, BILLING_KEY)
    monkeypatch.setenv("HELIOTROPE_HOME", str(tmp_path / "home"))

    hooks = Hooks()
    hooks.on("ec2:DescribeSpotPriceHistory", spot_price_history(AWS_SPOT_USD))
    hooks.on("pricing:GetProducts", pricing_products())
    hooks.on("ssm:GetParameter", dlami_parameter)
    compute = FakeCompute(
        PROJECT, cluster_label=label_value(CLUSTER), record_globally=False
    ).start()
    try:
        with mock_aws():
            yield CloudFakes(hooks, compute, Raw(), tmp_path)
    finally:
        compute.stop()


@pytest.fixture
def cloud_fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CloudFakes]:
    with open_cloud_fakes(monkeypatch, tmp_path) as fakes:
        yield fakes


def json_out(text: str) -> Any:
    return json.loads(text)


# -- Azure and Kubernetes ---------------------------------------------------------------------

KUBE_CONTEXTS = ("onprem", "gpucloud")


@dataclass
class NewCloudFakes:
    """The Azure suite's fake Resource Manager (with the Retail Prices API) and the
    Kubernetes suite's two fake API servers (an on-premises pool, a GPU cloud) behind a
    kubeconfig: what the registry builds Azure and Kubernetes providers against."""

    arm: Any  # tests.providers.azure.fake_arm.FakeArm
    kube: dict[str, Any]  # context -> tests.providers.kubernetes.fake_kube.FakeKube
    kubeconfig: Path

    def azure_section(self) -> dict[str, Any]:
        from tests.providers.azure.support import REGIONS, RESOURCE_GROUP, SSH_KEY, SUBNETS
        from tests.providers.azure.support import SUBSCRIPTION as AZURE_SUBSCRIPTION

        return {
            "subscription_id": AZURE_SUBSCRIPTION,
            "resource_group": RESOURCE_GROUP,
            "regions": list(REGIONS),
            "subnet_ids": dict(SUBNETS),
            "ssh_public_key": SSH_KEY,
            "prices_endpoint": self.arm.url,
            "poll_interval_s": 0.0,
        }

    def k8s_section(self) -> dict[str, Any]:
        return {
            "kubeconfig": str(self.kubeconfig),
            "image": "registry.example/trainer:1",
            "contexts": [
                {
                    "context": "onprem",
                    "grid_zone": "DE",
                    "usd_per_gpu_hour": {"A100-80GB": 1.10, "L4": 0.35},
                },
                {
                    "context": "gpucloud",
                    "grid_zone": "US-MIDA-PJM",
                    "pue": 1.25,
                    "usd_per_gpu_hour": {"H100": 2.49},
                    "spot_usd_per_gpu_hour": {"H100": 1.25},
                },
            ],
        }

    def access(
        self, base: CloudAccess | None = None, sleep: Callable[[float], None] | None = None
    ) -> CloudAccess:
        """`base`'s access (AWS, GCP) plus Azure's credential and transport."""
        from providers.azure.spec import AzureAccess
        from tests.providers.azure.fake_arm import FakeCredential

        clouds = dict(base.clouds) if base is not None else {}
        clouds["azure"] = AzureAccess(credential=FakeCredential(), transport=self.arm.transport())
        return CloudAccess(
            clouds, sleep=sleep or (base.sleep if base else None) or (lambda s: None)
        )

    def label_spot(self, context: str, node: str, *, value: str = "spot") -> None:
        """The cluster's part: node `node` of `context` is in a spot node pool now."""
        self._node(context, node)["metadata"]["labels"]["karpenter.sh/capacity-type"] = value

    def make_ready(self, context: str, node: str) -> None:
        """The cluster's part: the kubelet of `node` reports Ready again."""
        for condition in self._node(context, node)["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition.update(
                    status="True", reason="KubeletReady", message="kubelet is posting ready status"
                )

    def _node(self, context: str, node: str) -> dict[str, Any]:
        [found] = [n for n in self.kube[context].nodes if n["metadata"]["name"] == node]
        node_doc: dict[str, Any] = found
        return node_doc


@contextlib.contextmanager
def open_new_cloud_fakes(tmp_path: Path) -> Iterator[NewCloudFakes]:
    from tests.providers.azure.fake_arm import FakeArm
    from tests.providers.azure.support import RESOURCE_GROUP
    from tests.providers.azure.support import SUBSCRIPTION as AZURE_SUBSCRIPTION
    from tests.providers.kubernetes.fake_kube import FakeKube
    from tests.providers.kubernetes.support import write_kubeconfig

    arm = FakeArm(AZURE_SUBSCRIPTION, RESOURCE_GROUP, record_globally=False).start()
    kube = {
        "onprem": FakeKube("nodes_onprem.json", record_globally=False).start(),
        "gpucloud": FakeKube(
            "nodes_gpucloud.json", token="other-cluster-token", record_globally=False
        ).start(),
    }
    try:
        yield NewCloudFakes(arm, kube, write_kubeconfig(tmp_path / "kubeconfig", kube))
    finally:
        arm.stop()
        for fake in kube.values():
            fake.stop()


@pytest.fixture
def new_cloud_fakes(tmp_path: Path) -> Iterator[NewCloudFakes]:
    with open_new_cloud_fakes(tmp_path) as fakes:
        yield fakes
