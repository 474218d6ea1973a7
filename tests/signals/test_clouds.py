"""AWS (through botocore's Stubber: real request validation and response shapes, recorded
bodies) and the GCP Billing Catalog (through the fixture server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import numpy as np
import pandas as pd
import pytest
from botocore.stub import ANY, Stubber

from orchestrator.errors import HeliotropeError
from orchestrator.signals.sources.clouds import (
    AwsOnDemand,
    AwsPlacementScore,
    AwsSpotAdvisor,
    AwsSpotPrice,
    CapacityObservation,
    GcpBilling,
    capacity_samples,
)
from orchestrator.signals.sources.errors import AuthFailed, MalformedResponse
from orchestrator.signals.sources.tracemap import samples_to_rows
from tests.signals.conftest import NOW, make_ctx
from tests.signals.server import FixtureServer, Reply, recorded


def _times(obj: Any) -> Any:
    """Recorded JSON with the datetimes boto3 would have parsed."""
    if isinstance(obj, dict):
        return {
            k: (datetime.fromisoformat(v) if k == "Timestamp" else _times(v))
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [_times(x) for x in obj]
    return obj


def _load(name: str) -> Any:
    return _times(json.loads(recorded(name)))


class StubClients:
    """`AwsClients` whose EC2 / Pricing clients are botocore-stubbed, one per region."""

    def __init__(self) -> None:
        session = boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        )
        self._ec2: dict[str, Any] = {}
        self.stubbers: dict[str, Stubber] = {}
        self._session = session

    def _stub(self, service: str, region: str) -> Any:
        key = f"{service}:{region}"
        if key not in self._ec2:
            client = self._session.client(service, region_name=region)
            self._ec2[key] = client
            self.stubbers[key] = Stubber(client)
            self.stubbers[key].activate()
        return self._ec2[key]

    def ec2(self, region: str) -> Any:
        return self._stub("ec2", region)

    def pricing(self, region: str) -> Any:
        return self._stub("pricing", region)

    def stub(self, service: str, region: str) -> Stubber:
        self._stub(service, region)
        return self.stubbers[f"{service}:{region}"]


@pytest.fixture
def aws() -> Iterator[StubClients]:
    clients = StubClients()
    yield clients
    for stubber in clients.stubbers.values():
        stubber.assert_no_pending_responses()


def test_spot_price_history_paginated(server: FixtureServer, aws: StubClients) -> None:
    ec2 = aws.stub("ec2", "us-east-1")
    start, end = NOW - timedelta(hours=6), NOW
    params = {
        "InstanceTypes": ["g5.xlarge", "p3.2xlarge"],
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": start,
        "EndTime": end,
    }
    ec2.add_response(
        "describe_spot_price_history", _load("aws_spot_price_history_page1.json"), params
    )
    ec2.add_response(
        "describe_spot_price_history",
        _load("aws_spot_price_history_page2.json"),
        {**params, "NextToken": "AAEAAQFKDWQ1c3BvdC1wcmljZS1oaXN0b3J5LXBhZ2UtMg=="},
    )
    ctx = make_ctx(server, aws_clients=aws, aws_instance_types=["g5.xlarge", "p3.2xlarge"])
    frame = AwsSpotPrice(ctx).read(["us-east-1"], start, end)
    assert set(frame["kind"]) == {"price"} and set(frame["unit"]) == {"usd_per_hour"}
    a = frame[frame["key"] == "aws/us-east-1/us-east-1a/p3.2xlarge/spot"].reset_index(drop=True)
    # the 21:14 price was in effect at the window start: moved to it, valid until the change
    assert a.loc[0, "time"] == pd.Timestamp(start) and a.loc[0, "value"] == pytest.approx(0.918)
    assert a.loc[0, "valid_until"] == pd.Timestamp("2024-03-31T02:44:51Z")
    assert a.loc[1, "valid_until"] == pd.Timestamp(NOW + timedelta(hours=1))  # until next poll
    assert len(frame) == 5
    rows = samples_to_rows(frame)
    assert set(rows.candidates["zone"]) == {"us-east-1a", "us-east-1b", "us-east-1c"}


def test_spot_price_throttling_is_retried(server: FixtureServer, aws: StubClients) -> None:
    ec2 = aws.stub("ec2", "us-west-2")
    ec2.add_client_error(
        "describe_spot_price_history", "RequestLimitExceeded", http_status_code=503
    )
    ec2.add_response("describe_spot_price_history", {"SpotPriceHistory": [], "NextToken": ""})
    sleeps: list[float] = []
    ctx = make_ctx(server, aws_clients=aws, aws_instance_types=["p3.2xlarge"])
    ctx.sleep = sleeps.append
    frame = AwsSpotPrice(ctx).read(["us-west-2"], NOW - timedelta(hours=1), NOW)
    assert frame.empty and len(sleeps) == 1


def test_spot_price_auth_error_is_permanent(server: FixtureServer, aws: StubClients) -> None:
    aws.stub("ec2", "us-east-1").add_client_error(
        "describe_spot_price_history", "UnauthorizedOperation", http_status_code=403
    )
    ctx = make_ctx(server, aws_clients=aws, aws_instance_types=["p3.2xlarge"])
    frame, errors = AwsSpotPrice(ctx).read_partial(["us-east-1"], NOW - timedelta(hours=1), NOW)
    assert frame.empty and "UnauthorizedOperation" in str(errors["us-east-1"])


def test_placement_scores_by_zone_name(server: FixtureServer, aws: StubClients) -> None:
    aws.stub("ec2", "us-east-1").add_response(
        "describe_availability_zones", _load("aws_describe_availability_zones.json")
    )
    aws.stub("ec2", "us-east-1").add_response(
        "get_spot_placement_scores",
        _load("aws_placement_scores.json"),
        {
            "InstanceTypes": ["p5.48xlarge"],
            "TargetCapacity": 1,
            "TargetCapacityUnitType": "units",
            "SingleAvailabilityZone": True,
            "RegionNames": ["us-east-1"],
        },
    )
    ctx = make_ctx(server, aws_clients=aws, aws_instance_types=["p5.48xlarge"])
    frame = AwsPlacementScore(ctx).read(["us-east-1"], NOW, NOW)
    assert dict(zip(frame["key"], frame["value"], strict=True)) == {
        "aws/us-east-1/us-east-1a/p5.48xlarge": 9.0,
        "aws/us-east-1/us-east-1b/p5.48xlarge": 5.0,
        "aws/us-east-1/us-east-1c/p5.48xlarge": 1.0,
    }
    spot = samples_to_rows(frame).spot
    cap = dict(zip(spot.dropna()["zone"], spot.dropna()["capacity"], strict=True))
    assert cap == {"us-east-1a": 1.0, "us-east-1c": 0.0}  # a middling score is unknown


def test_on_demand_from_the_pricing_api(server: FixtureServer, aws: StubClients) -> None:
    pricing = aws.stub("pricing", "us-east-1")
    pricing.add_response(
        "get_products",
        _load("aws_pricing_get_products_p3.json"),
        {"ServiceCode": "AmazonEC2", "Filters": ANY, "FormatVersion": "aws_v1"},
    )
    pricing.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": []},
        {"ServiceCode": "AmazonEC2", "Filters": ANY, "FormatVersion": "aws_v1"},
    )
    ctx = make_ctx(server, aws_clients=aws, aws_instance_types=["p3.2xlarge", "p5.48xlarge"])
    frame = AwsOnDemand(ctx).read(["us-east-1"], NOW, NOW)
    assert frame["key"].tolist() == ["aws/us-east-1//p3.2xlarge/on_demand"]  # p5: not listed
    assert frame["value"].tolist() == [3.06]
    assert (frame["valid_until"] == pd.Timestamp(NOW + timedelta(days=7))).all()


def test_spot_advisor_bands(server: FixtureServer) -> None:
    server.add(r"/spot-advisor-data.json$", Reply.file("aws_spot_advisor.json"))
    frame = AwsSpotAdvisor(make_ctx(server)).read(["us-east-1", "eu-west-1"], NOW, NOW)
    band = frame[frame["unit"] == "interruption_pct_max"]
    assert dict(zip(band["key"], band["value"], strict=True)) == {
        "aws/us-east-1//g5.xlarge": 11.0,
        "aws/us-east-1//p3.2xlarge": 22.0,
        "aws/eu-west-1//p3.2xlarge": 100.0,
    }  # m5.large (no GPU) and Windows rows left out
    assert set(frame["kind"]) == {"spot_availability"}


def test_spot_advisor_bad_band_is_malformed(server: FixtureServer) -> None:
    data = json.loads(recorded("aws_spot_advisor.json"))
    data["spot_advisor"]["us-east-1"]["Linux"]["p3.2xlarge"]["r"] = 9
    server.add(r"/spot-advisor-data.json$", Reply(200, json.dumps(data)))
    with pytest.raises(MalformedResponse, match=r"p3\.2xlarge\.r"):
        AwsSpotAdvisor(make_ctx(server)).read(["us-east-1"], NOW, NOW)


def test_gcp_billing_pages_to_machine_prices(server: FixtureServer) -> None:
    def page(req):  # type: ignore[no-untyped-def]
        page = 2 if req.q("pageToken") else 1
        return Reply.file(f"gcp_billing_skus_page{page}.json")

    server.add(r"/v1/services/6F81-5844-456A/skus$", handler=page)
    frame = GcpBilling(make_ctx(server)).read(["us-central1", "europe-west4"], NOW, NOW)
    reqs = server.hits("skus$")
    assert [r.q("pageToken") for r in reqs] == ["", "page-2"]
    assert reqs[0].headers["X-Goog-Api-Key"] == "AIzaSy-gcp-key-4e0a9b"
    assert "key" not in reqs[0].query
    keys = set(frame["key"])
    assert "gcp/us-central1//a2-highgpu-1g/on_demand" in keys
    assert "gcp/us-central1//a2-highgpu-1g/spot" in keys
    price = frame.set_index("key")["value"]
    assert (
        price["gcp/us-central1//a2-highgpu-1g/spot"]
        < price["gcp/us-central1//a2-highgpu-1g/on_demand"]
    )
    assert (frame["value"] > 0).all()


def test_gcp_billing_403_is_reported(server: FixtureServer) -> None:
    server.add(r"/skus$", Reply.file("gcp_billing_skus_page1.json", status=403))
    frame, errors = GcpBilling(make_ctx(server)).read_partial(["us-central1"], NOW, NOW)
    assert frame.empty and isinstance(errors["*"], AuthFailed)
    assert "GCP_BILLING_API_KEY" in str(errors["*"])


def test_gcp_billing_negative_price_is_malformed(server: FixtureServer) -> None:
    body = recorded("gcp_billing_skus_page1.json").replace(
        b'"nanos": 31611000', b'"nanos": -31611000'
    )
    server.add(r"/skus$", Reply(200, body))
    with pytest.raises(MalformedResponse, match="nanos"):
        GcpBilling(make_ctx(server)).read(["us-central1"], NOW, NOW)


def test_capacity_errors_become_availability_samples() -> None:
    when = datetime(2024, 3, 31, 3, tzinfo=UTC)
    frame = capacity_samples(
        [CapacityObservation("gcp", "us-central1-a", "a3-highgpu-8g", when, False)], NOW
    )
    assert frame["key"].tolist() == ["gcp/us-central1/us-central1-a/a3-highgpu-8g"]
    spot = samples_to_rows(frame).spot
    assert spot["capacity"].tolist()[0] == 0.0 and spot["capacity"].isna().tolist()[1]
    assert isinstance(HeliotropeError("x"), Exception)


def test_aws_poll_into_a_trace_gives_priced_offers(
    server: FixtureServer, aws: StubClients, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from orchestrator.signals.grid import SignalGrid
    from orchestrator.signals.poll import poll
    from orchestrator.signals.traces import read_trace

    ec2 = aws.stub("ec2", "us-east-1")
    ec2.add_response("describe_spot_price_history", _load("aws_spot_price_history_page1.json"))
    ec2.add_response("describe_spot_price_history", _load("aws_spot_price_history_page2.json"))
    pricing = aws.stub("pricing", "us-east-1")
    pricing.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []})  # g5
    pricing.add_response("get_products", _load("aws_pricing_get_products_p3.json"))
    report = poll(
        ["aws-spot-price", "aws-ondemand"],
        tmp_path / "aws",
        now=NOW,
        regions=[("aws", "us-east-1")],
        env={},
        sleep=lambda s: None,
        options={"aws_clients": aws, "aws_instance_types": ["g5.xlarge", "p3.2xlarge"]},
    )
    assert report.ok, report.table()
    trace = read_trace(tmp_path / "aws")
    assert set(trace.offers["zone"]) == {"us-east-1a", "us-east-1b", "us-east-1c"}
    assert set(trace.offers["grid_zone"]) == {"US-MIDA-PJM"}
    grid = SignalGrid.build(trace, NOW - timedelta(minutes=30), NOW + timedelta(minutes=30), 600)
    p3 = [i for i, o in enumerate(grid.offers) if o.instance_type == "p3.2xlarge"]
    by_id = {grid.offers[i].id: grid.usd_per_hour[-1, i] for i in p3}  # 04:20
    assert by_id["aws:us-east-1a:p3.2xlarge:on_demand"] == pytest.approx(3.06)
    assert by_id["aws:us-east-1a:p3.2xlarge:spot"] == pytest.approx(0.9351)
    # one poll ahead of the end: the spot price becomes unknown an hour after the poll
    later = SignalGrid.build(trace, NOW + timedelta(hours=2), NOW + timedelta(hours=3), 600)
    spot = [i for i, o in enumerate(later.offers) if o.market.value == "spot"]
    assert not spot or np.isnan(later.usd_per_hour[:, spot]).all()
