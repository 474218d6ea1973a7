"""Fixtures for the AWS adapter tests.

- moto in process (`mock_aws`) behind fake credentials; nothing reaches AWS;
- `session_factory`: the boto3 sessions the adapter gets. Each one records every API
  operation the adapter calls (service, operation, parameter names) into `RECORDED`, for
  the least-privilege test, and dispatches to `Hooks`: per-test botocore `before-call`
  handlers that answer a call with a recorded-shape response or an AWS error, at the API
  layer (what moto does not model: spot price history, the Pricing API, the Deep Learning
  AMI parameter, spot request status changes, throttling, capacity and quota errors);
- `raw`: plain clients for setting moto up and looking at it, outside the adapter (not
  recorded, no hooks).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from providers.aws import DEFAULT_AMI_PARAMETER, AwsProvider

HERE = Path(__file__).resolve().parent
T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
CLUSTER = "test"
REGIONS = ("us-east-1", "us-west-2")
DLAMI_ID = "ami-0d1a2b3c4d5e6f701"  # stands in for the Deep Learning AMI

# (IAM service prefix, operation, parameter names) of every call the adapter made.
RECORDED: set[tuple[str, str, frozenset[str]]] = set()
_SELECTED_MODULES: set[str] = set()
_DESELECTED: list[str] = []
IAM_TEST = "test_iam_policy.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the least-privilege test after every other AWS test (it reads what they did)."""
    last = [i for i in items if i.path.parent == HERE and i.path.name == IAM_TEST]
    rest = [i for i in items if i not in last]
    items[:] = rest + last


def pytest_deselected(items: list[pytest.Item]) -> None:
    _DESELECTED.extend(i.nodeid for i in items if i.path.parent == HERE)


@pytest.fixture(scope="session")
def aws_suite_complete(request: pytest.FixtureRequest) -> bool:
    """Whether every AWS test module was collected and nothing in them deselected."""
    modules = {p.name for p in HERE.glob("test_*.py")}
    collected = {i.path.name for i in request.session.items if i.path.parent == HERE}
    return collected == modules and not _DESELECTED


@pytest.fixture(scope="session")
def recorded_calls() -> set[tuple[str, str, frozenset[str]]]:
    return RECORDED


# -- answers at the API layer ---------------------------------------------------------------


@dataclass(frozen=True)
class AwsError:
    """An error response, as AWS sends it (botocore builds the ClientError from it)."""

    code: str
    message: str = "injected by the test"
    status: int = 400


Answer = Mapping[str, Any] | AwsError | None
Handler = Callable[[dict[str, Any]], Answer]


@dataclass
class Hooks:
    """Handlers by "service:Operation" (IAM prefix), called with the API parameters (and
    the client's region as "_region"); an answer of None lets the call through to moto.
    `calls` logs every call of the current test."""

    handlers: dict[str, Handler] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def on(self, operation: str, handler: Handler) -> None:
        self.handlers[operation] = handler

    def fail(
        self, operation: str, code: str, *, times: int | None = None, status: int = 400
    ) -> None:
        """Answer `operation` with error `code` (the first `times` calls, or always)."""
        left = [times]

        def handler(params: dict[str, Any]) -> Answer:
            if left[0] is not None:
                if left[0] <= 0:
                    return None
                left[0] -= 1
            return AwsError(code, status=status)

        self.on(operation, handler)

    def called(self, operation: str) -> list[dict[str, Any]]:
        return [params for op, params in self.calls if op == operation]

    # botocore event handlers
    def record(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        service = model.service_model.signing_name
        RECORDED.add((service, model.name, frozenset(params)))
        context["heliotrope_test_params"] = dict(params)

    def dispatch(self, model: Any, context: dict[str, Any], **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        operation = f"{model.service_model.signing_name}:{model.name}"
        params = {
            **context.get("heliotrope_test_params", {}),
            "_region": context.get("client_region"),
        }
        self.calls.append((operation, params))
        handler = self.handlers.get(operation)
        answer = handler(params) if handler is not None else None
        if answer is None:
            return None
        if isinstance(answer, AwsError):
            return (
                AWSResponse(None, answer.status, {}, None),
                {
                    "Error": {"Code": answer.code, "Message": answer.message},
                    "ResponseMetadata": {"HTTPStatusCode": answer.status},
                },
            )
        return (
            AWSResponse(None, 200, {}, None),
            {"ResponseMetadata": {"HTTPStatusCode": 200}, **answer},
        )


# -- recorded-shape answers -----------------------------------------------------------------

# Instance types moto describes (with GpuInfo and zone offerings): g5.xlarge (A10G),
# p4d.24xlarge (8 x A100-40GB), g6.2xlarge (L4). us-east-1e sells no g5.xlarge in moto: a
# spot price there must not make an offer.
SPOT_USD: dict[tuple[str, str], float] = {
    ("us-east-1a", "g5.xlarge"): 0.4528,
    ("us-east-1b", "g5.xlarge"): 0.5012,
    ("us-east-1e", "g5.xlarge"): 0.3999,
    ("us-east-1a", "p4d.24xlarge"): 8.6,
    ("us-west-2a", "p4d.24xlarge"): 9.1,
}
ON_DEMAND_USD: dict[tuple[str, str], float] = {
    ("us-east-1", "g5.xlarge"): 1.006,
    ("us-east-1", "p4d.24xlarge"): 21.96,
}


def spot_price_history(prices: Mapping[tuple[str, str], float] = SPOT_USD) -> Handler:
    """DescribeSpotPriceHistory in the shape EC2 returns: per (zone, type) an older and a
    newer record (the newer one is the price in effect), over two pages."""

    def handler(params: dict[str, Any]) -> Answer:
        wanted = set(params.get("InstanceTypes", []))
        records = []
        for (zone, instance_type), usd in prices.items():
            if instance_type not in wanted:
                continue
            for age_h, price in ((6, usd * 1.5), (1, usd)):
                records.append(
                    {
                        "AvailabilityZone": zone,
                        "InstanceType": instance_type,
                        "ProductDescription": "Linux/UNIX",
                        "SpotPrice": f"{price:.6f}",
                        "Timestamp": T0 - timedelta(hours=age_h),
                    }
                )
        half = len(records) // 2
        if params.get("NextToken") == "page-2":
            return {"SpotPriceHistory": records[half:], "NextToken": ""}
        return {"SpotPriceHistory": records[:half], "NextToken": "page-2"}

    return handler


def price_list_item(instance_type: str, region: str, usd: float) -> str:
    """One GetProducts PriceList entry (FormatVersion aws_v1), as the Pricing API sends it."""
    return json.dumps(
        {
            "product": {
                "productFamily": "Compute Instance",
                "attributes": {
                    "instanceType": instance_type,
                    "regionCode": region,
                    "operatingSystem": "Linux",
                    "tenancy": "Shared",
                    "preInstalledSw": "NA",
                    "capacitystatus": "Used",
                    "marketoption": "OnDemand",
                    "licenseModel": "No License required",
                },
                "sku": "TESTSKU",
            },
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    "TESTSKU.JRTCKXETXF": {
                        "offerTermCode": "JRTCKXETXF",
                        "sku": "TESTSKU",
                        "effectiveDate": "2025-02-01T00:00:00Z",
                        "termAttributes": {},
                        "priceDimensions": {
                            "TESTSKU.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "beginRange": "0",
                                "endRange": "Inf",
                                "appliesTo": [],
                                "rateCode": "TESTSKU.JRTCKXETXF.6YS6EN2CT7",
                                "description": (
                                    f"${usd} per On Demand Linux {instance_type} Instance Hour"
                                ),
                                "pricePerUnit": {"USD": f"{usd:.10f}"},
                            }
                        },
                    }
                }
            },
            "version": "20250201000000",
            "publicationDate": "2025-02-01T00:00:00Z",
        }
    )


def pricing_products(prices: Mapping[tuple[str, str], float] = ON_DEMAND_USD) -> Handler:
    """GetProducts: a product for the filtered (region, type) when listed, else none."""

    def handler(params: dict[str, Any]) -> Answer:
        terms = {f["Field"]: f["Value"] for f in params.get("Filters", [])}
        key = (terms.get("regionCode", ""), terms.get("instanceType", ""))
        items = [price_list_item(key[1], key[0], prices[key])] if key in prices else []
        return {"FormatVersion": "aws_v1", "PriceList": items}

    return handler


def dlami_parameter(params: dict[str, Any]) -> Answer:
    if params.get("Name") != DEFAULT_AMI_PARAMETER:
        return AwsError("ParameterNotFound", status=400)
    return {
        "Parameter": {
            "Name": DEFAULT_AMI_PARAMETER,
            "Type": "String",
            "Value": DLAMI_ID,
            "Version": 42,
            "DataType": "aws:ec2:image",
        }
    }


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials only; no profile or config file of this machine is read."""
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ROLE_ARN",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ENDPOINT_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # moto: no catalogue of public AMIs (building it costs ~0.5 s per region and test);
    # RunInstances takes any image id unless MOTO_ENABLE_AMI_VALIDATION is set.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")


@pytest.fixture
def hooks() -> Hooks:
    """Default answers for what moto does not model; tests add or replace handlers."""
    h = Hooks()
    h.on("ec2:DescribeSpotPriceHistory", spot_price_history())
    h.on("pricing:GetProducts", pricing_products())
    h.on("ssm:GetParameter", dlami_parameter)
    return h


_LOADER: list[Any] = []


def new_session() -> Any:
    """A boto3 session that shares one botocore model loader with every other session of
    the test run (loading the EC2 model takes about half a second each time)."""
    import boto3
    import botocore.loaders
    import botocore.session

    if not _LOADER:
        _LOADER.append(botocore.loaders.create_loader())
    core = botocore.session.get_session()
    core.register_component("data_loader", _LOADER[0])
    return boto3.session.Session(botocore_session=core, region_name="us-east-1")


@pytest.fixture
def session_factory(hooks: Hooks) -> Callable[[], Any]:
    def make() -> Any:
        session = new_session()
        session.events.register_first("provide-client-params", hooks.record)
        session.events.register("before-call", hooks.dispatch)
        return session

    return make


@pytest.fixture
def moto() -> Iterator[None]:
    from moto import mock_aws

    with mock_aws():
        yield


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def make_provider(
    moto: None, session_factory: Callable[[], Any], clock: FakeClock
) -> Callable[..., AwsProvider]:
    def make(**overrides: Any) -> AwsProvider:
        settings: dict[str, Any] = {
            "cluster": CLUSTER,
            "regions": REGIONS,
            "session_factory": session_factory,
            "clock": clock,
        }
        settings.update(overrides)
        return AwsProvider(**settings)

    return make


@pytest.fixture
def provider(make_provider: Callable[..., AwsProvider]) -> AwsProvider:
    return make_provider()


class Raw:
    """Plain moto clients for setup and inspection (not the adapter's; not recorded)."""

    def __init__(self) -> None:
        self._session = new_session()

    def client(self, service: str, region: str = "us-east-1") -> Any:
        return self._session.client(service, region_name=region)

    def instance(self, instance_id: str, region: str = "us-east-1") -> dict[str, Any]:
        answer = self.client("ec2", region).describe_instances(InstanceIds=[instance_id])
        return answer["Reservations"][0]["Instances"][0]

    def state(self, instance_id: str, region: str = "us-east-1") -> str:
        return str(self.instance(instance_id, region)["State"]["Name"])

    def tags(self, instance_id: str, region: str = "us-east-1") -> dict[str, str]:
        return {t["Key"]: t["Value"] for t in self.instance(instance_id, region).get("Tags", [])}

    def run(
        self,
        *,
        tags: Mapping[str, str] | None = None,
        region: str = "us-east-1",
        zone: str = "us-east-1a",
        instance_type: str = "p3.2xlarge",
        count: int = 1,
        spot: bool = False,
    ) -> list[str]:
        """Instances made outside the adapter (someone else's, or a test's setup)."""
        params: dict[str, Any] = {
            "ImageId": DLAMI_ID,
            "InstanceType": instance_type,
            "MinCount": count,
            "MaxCount": count,
            "Placement": {"AvailabilityZone": zone},
        }
        if tags:
            params["TagSpecifications"] = [
                {
                    "ResourceType": "instance",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ]
        if spot:
            params["InstanceMarketOptions"] = {"MarketType": "spot"}
        answer = self.client("ec2", region).run_instances(**params)
        return [i["InstanceId"] for i in answer["Instances"]]

    def terminate(self, *ids: str, region: str = "us-east-1") -> None:
        self.client("ec2", region).terminate_instances(InstanceIds=list(ids))

    def count(self, region: str = "us-east-1") -> int:
        answer = self.client("ec2", region).describe_instances()
        return sum(len(r["Instances"]) for r in answer["Reservations"])


@pytest.fixture
def raw(moto: None) -> Raw:
    return Raw()
