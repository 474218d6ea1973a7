"""AWS errors become FailureKinds; throttling is retried at the edge, without sleeping.

Errors are injected at the API layer: a botocore `before-call` handler answers the call
with the error response AWS would send, and botocore raises the ClientError from it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from orchestrator.clock import FakeClock
from orchestrator.errors import PermanentError, TransientError
from orchestrator.model import Market, Offer
from providers.aws import AwsPermanentError, AwsProvider, AwsTransientError
from providers.aws.errors import EdgeRetry, failure_kind, kind_of_code
from providers.base import FailureKind, LaunchSpec

from .conftest import CLUSTER, T0, Hooks, Raw

SPOT = Offer.make_id("aws", "us-east-1a", "p3.2xlarge", Market.SPOT)


def spec() -> LaunchSpec:
    return LaunchSpec(
        job_id="job-1", offer_id=SPOT, cluster=CLUSTER, entrypoint=("python", "train.py")
    )


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("InsufficientInstanceCapacity", FailureKind.CAPACITY),
        ("InsufficientCapacity", FailureKind.CAPACITY),
        ("SpotMaxPriceTooLow", FailureKind.CAPACITY),
        ("Unsupported", FailureKind.CAPACITY),
        ("VcpuLimitExceeded", FailureKind.QUOTA),
        ("MaxSpotInstanceCountExceeded", FailureKind.QUOTA),
        ("InstanceLimitExceeded", FailureKind.QUOTA),
        ("UnauthorizedOperation", FailureKind.AUTH),
        ("AuthFailure", FailureKind.AUTH),
        ("InvalidParameterValue", FailureKind.INVALID),
        ("InvalidParameterCombination", FailureKind.INVALID),
        ("InvalidAMIID.NotFound", FailureKind.INVALID),
        ("IdempotentParameterMismatch", FailureKind.INVALID),
    ],
)
def test_launch_errors_come_back_as_data(
    provider: AwsProvider, hooks: Hooks, raw: Raw, code: str, kind: FailureKind
) -> None:
    hooks.fail("ec2:RunInstances", code)
    outcome = provider.launch(spec(), request_id=f"req-{code}")

    assert outcome.instance_id is None
    assert outcome.error is not None
    assert outcome.error.kind is kind
    assert code in outcome.error.message and "RunInstances" in outcome.error.message
    assert len(hooks.called("ec2:RunInstances")) == 1  # only throttling is retried
    assert raw.count() == 0


def test_throttled_launch_is_retried_with_the_same_token_and_no_real_sleep(
    provider: AwsProvider, hooks: Hooks, raw: Raw, clock: FakeClock
) -> None:
    hooks.fail("ec2:RunInstances", "RequestLimitExceeded", times=2)
    started = time.monotonic()

    outcome = provider.launch(spec(), request_id="req-throttled")

    assert outcome.ok
    attempts = hooks.called("ec2:RunInstances")
    assert len(attempts) == 3
    assert {a["ClientToken"] for a in attempts} == {"req-throttled"}
    assert raw.count() == 1
    assert clock.now() > T0  # the waits went through the injected clock ...
    assert time.monotonic() - started < 5.0  # ... not through time.sleep


def test_throttling_that_does_not_stop_is_transient(
    make_provider: Callable[..., AwsProvider], hooks: Hooks
) -> None:
    provider = make_provider(retry_attempts=3)
    hooks.fail("ec2:RunInstances", "RequestLimitExceeded")
    outcome = provider.launch(spec(), request_id="req-busy")
    assert outcome.error is not None and outcome.error.kind is FailureKind.TRANSIENT
    assert outcome.error.retry_after_s > 0
    assert len(hooks.called("ec2:RunInstances")) == 3


def test_server_errors_are_retried(provider: AwsProvider, hooks: Hooks) -> None:
    hooks.fail("ec2:DescribeInstances", "InternalError", times=1, status=500)
    assert provider.list_instances(cluster=CLUSTER) == {}
    assert len(hooks.called("ec2:DescribeInstances")) == 3  # 1 failed + 1 per region


def test_list_without_permission_raises_a_permanent_error(
    provider: AwsProvider, hooks: Hooks
) -> None:
    hooks.fail("ec2:DescribeInstances", "UnauthorizedOperation", status=403)
    with pytest.raises(PermanentError) as caught:
        provider.list_instances(cluster=CLUSTER)
    assert isinstance(caught.value, AwsPermanentError)
    assert caught.value.failure.kind is FailureKind.AUTH
    assert len(hooks.called("ec2:DescribeInstances")) == 1


def test_terminate_under_throttling_raises_a_transient_error(
    make_provider: Callable[..., AwsProvider], hooks: Hooks
) -> None:
    provider = make_provider(retry_attempts=2)
    hooks.fail("ec2:DescribeInstances", "RequestLimitExceeded")
    with pytest.raises(TransientError) as caught:
        provider.terminate(["i-0123456789abcdef0"], request_id="stop-1")
    assert isinstance(caught.value, AwsTransientError)
    assert caught.value.retry_after_s > 0


def test_connection_and_credential_errors() -> None:
    from botocore.exceptions import (
        EndpointConnectionError,
        NoCredentialsError,
        ParamValidationError,
        ReadTimeoutError,
    )

    assert failure_kind(EndpointConnectionError(endpoint_url="https://ec2")) is (
        FailureKind.TRANSIENT
    )
    assert failure_kind(ReadTimeoutError(endpoint_url="https://ec2")) is FailureKind.TRANSIENT
    assert failure_kind(NoCredentialsError()) is FailureKind.AUTH
    assert failure_kind(ParamValidationError(report="bad")) is FailureKind.INVALID


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("SomethingNew", 503, FailureKind.TRANSIENT),
        ("SomethingNew", 400, FailureKind.INVALID),
        ("SomethingNew", 403, FailureKind.AUTH),
        ("Throttling", 400, FailureKind.TRANSIENT),
        ("ThrottlingException", 400, FailureKind.TRANSIENT),
        ("InvalidParameter", 400, FailureKind.INVALID),
    ],
)
def test_unlisted_codes_fall_back_on_the_http_status(
    code: str, status: int, kind: FailureKind
) -> None:
    assert kind_of_code(code, status) is kind


def test_edge_retry_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="attempts"):
        EdgeRetry(lambda s: None, attempts=0)
