"""AWS errors, mapped once, here: every botocore exception becomes a `FailureKind`.

- `failure_of(exc)` turns an exception into a `ProviderFailure` (launch returns it as data);
- `raise_mapped(exc)` raises it as `AwsTransientError` / `AwsPermanentError` (one error
  root: `orchestrator.errors`) for the calls that have no error channel (list, terminate,
  poll, offers);
- `EdgeRetry` retries TRANSIENT failures (throttling, 5xx, connection errors) with
  tenacity at this edge only, `reraise=True`, with an injectable sleep.

Codes are from the EC2 API reference "Error codes for the Amazon EC2 API" and the common
AWS error codes. A code not listed is INVALID for a 4xx answer and TRANSIENT for a 5xx.
Messages are AWS's own (they carry no credentials); they are cut to `MESSAGE_CHARS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final, NoReturn, TypeVar

import tenacity

from orchestrator.errors import PermanentError, TransientError
from providers.base import FailureKind, ProviderFailure

logger = logging.getLogger(__name__)

T = TypeVar("T")

MESSAGE_CHARS: Final = 300
TRANSIENT_RETRY_AFTER_S: Final = 30.0  # after EdgeRetry gave up: try again in a while

# No capacity now: another zone, another market or later may work.
CAPACITY_CODES: Final = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacityOnHost",
        "SpotMaxPriceTooLow",  # the spot price is above the maximum we offered
        "Unsupported",  # the instance type is not sold in the requested zone (now)
    }
)
# Account limits: a person has to raise them.
QUOTA_CODES: Final = frozenset(
    {
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "InstanceLimitExceeded",
        "ResourceLimitExceeded",
        "VolumeLimitExceeded",
        "MaxIOPSLimitExceeded",
        "InsufficientFreeAddressesInSubnet",
    }
)
# Credentials or permissions.
AUTH_CODES: Final = frozenset(
    {
        "UnauthorizedOperation",
        "AuthFailure",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "UnrecognizedClientException",
        "OptInRequired",
        "Blocked",
        "PendingVerification",
    }
)
# Throttling and server-side trouble: retried at the edge.
TRANSIENT_CODES: Final = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "PriorRequestNotComplete",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "EC2ThrottledException",
    }
)
# Bad requests that are not `Invalid*` by name.
INVALID_CODES: Final = frozenset(
    {
        "MissingParameter",
        "ValidationError",
        "ValidationException",
        "IdempotentParameterMismatch",  # the request id was used for a different launch
        "ParameterNotFound",  # SSM: no such AMI parameter
        "UnknownParameter",
    }
)


class AwsTransientError(TransientError):
    """An AWS call failed in a way that may pass (after `retry_after_s`)."""

    def __init__(self, failure: ProviderFailure) -> None:
        super().__init__(failure.message, retry_after_s=failure.retry_after_s)
        self.failure = failure


class AwsPermanentError(PermanentError):
    """An AWS call failed in a way that retrying cannot fix (auth, quota, bad request)."""

    def __init__(self, failure: ProviderFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def error_code(exc: BaseException) -> str:
    """The AWS error code of a botocore `ClientError` ("" for anything else)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    error = response.get("Error")
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


def _http_status(exc: BaseException) -> int:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    meta = response.get("ResponseMetadata")
    status = meta.get("HTTPStatusCode", 0) if isinstance(meta, dict) else 0
    return status if isinstance(status, int) else 0


def kind_of_code(code: str, http_status: int = 400) -> FailureKind:
    """The failure kind of an AWS error code."""
    if code in CAPACITY_CODES:
        return FailureKind.CAPACITY
    if code in QUOTA_CODES:
        return FailureKind.QUOTA
    if code in AUTH_CODES:
        return FailureKind.AUTH
    if code in TRANSIENT_CODES:
        return FailureKind.TRANSIENT
    if code in INVALID_CODES or code.startswith("Invalid"):  # InvalidParameter*, InvalidAMIID.*
        return FailureKind.INVALID
    if http_status >= 500 or http_status == 429:
        return FailureKind.TRANSIENT
    if http_status in (401, 403):
        return FailureKind.AUTH
    return FailureKind.INVALID


def failure_kind(exc: BaseException) -> FailureKind:
    """The failure kind of any exception an AWS call can raise."""
    from botocore import exceptions as bx

    if isinstance(exc, bx.ClientError):
        return kind_of_code(error_code(exc), _http_status(exc))
    if isinstance(
        exc,
        bx.NoCredentialsError
        | bx.PartialCredentialsError
        | bx.CredentialRetrievalError
        | bx.TokenRetrievalError
        | bx.SSOError
        | bx.UnauthorizedSSOTokenError,
    ):
        return FailureKind.AUTH
    if isinstance(exc, bx.ConnectionError | bx.HTTPClientError):
        return FailureKind.TRANSIENT  # endpoint unreachable, timeouts, closed connections
    return FailureKind.INVALID  # ParamValidationError, NoRegionError, ...


def failure_of(exc: BaseException, *, action: str) -> ProviderFailure:
    """`exc` as data. `action` names the call ("ec2:RunInstances us-east-1")."""
    kind = failure_kind(exc)
    code = error_code(exc) or type(exc).__name__
    detail = _message(exc)
    message = f"{action}: {code}: {detail}" if detail else f"{action}: {code}"
    retry_after_s = TRANSIENT_RETRY_AFTER_S if kind is FailureKind.TRANSIENT else 0.0
    return ProviderFailure(kind, message[: MESSAGE_CHARS + len(action) + 2], retry_after_s)


def raise_mapped(exc: BaseException, *, action: str) -> NoReturn:
    """Raise `exc` as the Heliotrope error of its kind (capacity and transient failures
    may pass, so they are transient), chained to the original."""
    failure = failure_of(exc, action=action)
    if failure.kind in (FailureKind.TRANSIENT, FailureKind.CAPACITY):
        raise AwsTransientError(failure) from exc
    raise AwsPermanentError(failure) from exc


def is_aws_error(exc: BaseException) -> bool:
    """Whether `exc` comes from botocore (and so has a mapping here)."""
    from botocore import exceptions as bx

    return isinstance(exc, bx.BotoCoreError | bx.ClientError)


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error")
        if isinstance(error, dict):
            return " ".join(str(error.get("Message", "")).split())[:MESSAGE_CHARS]
    return " ".join(str(exc).split())[:MESSAGE_CHARS]


def _retryable(exc: BaseException) -> bool:
    return is_aws_error(exc) and failure_kind(exc) is FailureKind.TRANSIENT


class EdgeRetry:
    """Retry TRANSIENT AWS failures: exponential backoff with jitter, `attempts` in all,
    waiting through `sleep` (a `Clock.sleep`, so a fake clock makes tests instant); the
    last error is re-raised as it is (`reraise=True`). Only idempotent calls go through
    it (describes, and launches with a client token)."""

    def __init__(
        self,
        sleep: Callable[[float], None],
        *,
        attempts: int = 5,
        initial_wait_s: float = 1.0,
        max_wait_s: float = 20.0,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self._sleep = sleep
        self._attempts = attempts
        self._initial_wait_s = initial_wait_s
        self._max_wait_s = max_wait_s

    def __call__(self, fn: Callable[[], T], action: str) -> T:
        def log(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            wait_s = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "%s: %s (attempt %d of %d); retrying in %.1f s",
                action,
                error_code(exc) or type(exc).__name__ if exc is not None else "?",
                state.attempt_number,
                self._attempts,
                wait_s,
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable),
            stop=tenacity.stop_after_attempt(self._attempts),
            wait=tenacity.wait_exponential_jitter(
                initial=self._initial_wait_s, max=self._max_wait_s
            ),
            sleep=self._sleep,
            before_sleep=log,
            reraise=True,
        )
        return retrying(fn)
