"""errors.py: every Compute Engine error shape to a FailureKind, and what is retried."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions as api
from google.auth import exceptions as auth

from orchestrator.errors import PermanentError, TransientError
from providers.base import FailureKind, ProviderFailure
from providers.gcp import errors

CLASSIFY = [
    # (codes or reasons, message, HTTP status, kind)
    (["ZONE_RESOURCE_POOL_EXHAUSTED"], "", 503, FailureKind.CAPACITY),
    (["ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"], "", 503, FailureKind.CAPACITY),
    (["REGION_RESOURCE_POOL_EXHAUSTED"], "", None, FailureKind.CAPACITY),
    (
        [],
        "The zone 'projects/p/zones/z' does not have enough resources available to fulfill "
        "the request.",
        None,
        FailureKind.CAPACITY,
    ),
    (["RESOURCE_EXHAUSTED"], "", None, FailureKind.CAPACITY),  # an operation's stockout
    (["RESOURCE_EXHAUSTED"], "", 429, FailureKind.TRANSIENT),  # HTTP 429: throttled
    (["QUOTA_EXCEEDED"], "Quota 'GPUS_ALL_REGIONS' exceeded.", 403, FailureKind.QUOTA),
    (["quotaExceeded"], "Quota 'NVIDIA_A100_GPUS' exceeded.", 403, FailureKind.QUOTA),
    ([], "Quota 'CPUS' exceeded.  Limit: 24.0 in region us-west1.", 403, FailureKind.QUOTA),
    (
        ["rateLimitExceeded"],
        "Quota exceeded for quota metric 'Queries'",
        403,
        FailureKind.TRANSIENT,
    ),
    (
        ["rateLimitExceeded", "RATE_LIMIT_EXCEEDED"],
        "Quota exceeded for quota metric",
        429,
        FailureKind.TRANSIENT,
    ),
    ([], "", 429, FailureKind.TRANSIENT),
    (["backendError"], "", 503, FailureKind.TRANSIENT),
    ([], "", 500, FailureKind.TRANSIENT),
    (["forbidden"], "Required 'compute.instances.create' permission", 403, FailureKind.AUTH),
    (["PERMISSION_DENIED"], "", None, FailureKind.AUTH),
    (["accessNotConfigured"], "Compute Engine API has not been used", 403, FailureKind.AUTH),
    ([], "", 401, FailureKind.AUTH),
    (["invalid"], "Invalid value for field", 400, FailureKind.INVALID),
    (["notFound"], "", 404, FailureKind.INVALID),
    ([], "", 400, FailureKind.INVALID),
    (["INTERNAL_ERROR"], "", None, FailureKind.TRANSIENT),
    (["SOMETHING_NEW"], "", None, FailureKind.TRANSIENT),  # unknown: retrying costs no GPU
]


@pytest.mark.parametrize(("codes", "message", "status", "kind"), CLASSIFY)
def test_classify(codes: list[str], message: str, status: int | None, kind: FailureKind) -> None:
    assert errors.classify(codes, message, status) is kind


def _forbidden(reason: str) -> api.Forbidden:
    return api.Forbidden("denied", errors=[{"reason": reason, "domain": "global"}])


EXCEPTIONS = [
    # (exception, kind, retried here)
    (api.TooManyRequests("slow down"), FailureKind.TRANSIENT, True),
    (api.ServiceUnavailable("unavailable"), FailureKind.TRANSIENT, True),
    (api.InternalServerError("oops"), FailureKind.TRANSIENT, True),
    (
        api.ServiceUnavailable("The zone 'z' does not have enough resources available"),
        FailureKind.CAPACITY,
        False,
    ),
    (_forbidden("rateLimitExceeded"), FailureKind.TRANSIENT, True),
    (_forbidden("quotaExceeded"), FailureKind.QUOTA, False),
    (_forbidden("forbidden"), FailureKind.AUTH, False),
    (api.BadRequest("bad", errors=[{"reason": "invalid"}]), FailureKind.INVALID, False),
    (requests.ConnectionError("reset"), FailureKind.TRANSIENT, True),
    (requests.Timeout("slow"), FailureKind.TRANSIENT, True),
    (auth.TransportError("no route"), FailureKind.TRANSIENT, True),
    (auth.RefreshError("invalid_grant"), FailureKind.AUTH, False),
    (auth.DefaultCredentialsError("none"), FailureKind.AUTH, False),
    (TransientError("op not done", retry_after_s=7.0), FailureKind.TRANSIENT, False),
]


@pytest.mark.parametrize(("exc", "kind", "retried"), EXCEPTIONS)
def test_exceptions(exc: BaseException, kind: FailureKind, retried: bool) -> None:
    failure = errors.failure_from_exception(exc)
    assert failure.kind is kind
    assert errors.is_retryable(exc) is retried
    if kind is FailureKind.TRANSIENT:
        assert failure.retry_after_s > 0


def test_retry_after_header_is_honoured() -> None:
    response = requests.Response()
    response.status_code = 429
    response.headers["Retry-After"] = "12"
    exc = api.TooManyRequests("slow down", response=response)
    assert errors.failure_from_exception(exc).retry_after_s == 12.0


def test_operation_errors() -> None:
    assert errors.failure_from_operation([]) is None
    failure = errors.failure_from_operation(
        [("ZONE_RESOURCE_POOL_EXHAUSTED", "The zone 'z' does not have enough resources")],
        http_status=503,
        operation="operation-1",
    )
    assert failure is not None and failure.kind is FailureKind.CAPACITY
    assert "operation-1" in failure.message and "ZONE_RESOURCE_POOL_EXHAUSTED" in failure.message


@pytest.mark.parametrize(
    ("kind", "error_type"),
    [
        (FailureKind.TRANSIENT, TransientError),
        (FailureKind.CAPACITY, TransientError),
        (FailureKind.QUOTA, PermanentError),
        (FailureKind.AUTH, PermanentError),
        (FailureKind.INVALID, PermanentError),
    ],
)
def test_as_error(kind: FailureKind, error_type: type[Exception]) -> None:
    assert isinstance(errors.as_error(ProviderFailure(kind, "x")), error_type)
