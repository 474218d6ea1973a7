"""Kubernetes API errors as Heliotrope data.

The API server answers a refused request with an HTTP status and a `Status` object,
`{"kind": "Status", "status": "Failure", "reason": "Forbidden", "message": ..., "code": 403}`;
the client raises `ApiException(status, reason)` with that body. Connection trouble is a
urllib3 error. A 403 whose message says `exceeded quota` is a ResourceQuota of the
namespace (QUOTA), any other 403 is RBAC (AUTH); 422 `Invalid` and 404 (no such namespace)
are INVALID; 409 `AlreadyExists` is handled by the launch itself; 429 and 5xx are TRANSIENT.
"""

from __future__ import annotations

import json
from typing import Final

from orchestrator.errors import HeliotropeError, TransientError
from providers import failures
from providers.base import FailureKind, ProviderFailure

TRANSIENT_RETRY_AFTER_S: Final = 10.0
_TRANSIENT_HTTP: Final = frozenset({408, 429, 500, 502, 503, 504})


def status_of(exc: BaseException) -> tuple[int | None, str, str]:
    """(HTTP status, Status reason, message) of an ApiException."""
    status = getattr(exc, "status", None)
    reason = str(getattr(exc, "reason", "") or "")
    message = ""
    body = getattr(exc, "body", None)
    if body:
        try:
            parsed = json.loads(body)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, dict):
            reason = str(parsed.get("reason") or reason)
            message = str(parsed.get("message") or "")
    return (status if isinstance(status, int) else None), reason, message


def classify(status: int | None, reason: str, message: str) -> FailureKind:
    """The failure kind of an API error.

    >>> classify(403, "Forbidden", 'pods "x" is forbidden: exceeded quota: gpus')
    <FailureKind.QUOTA: 'quota'>
    """
    text = message.lower()
    if "exceeded quota" in text:
        return FailureKind.QUOTA
    if status in _TRANSIENT_HTTP or reason in ("TooManyRequests", "ServiceUnavailable", "Timeout"):
        return FailureKind.TRANSIENT
    if status in (401, 403) or reason in ("Unauthorized", "Forbidden"):
        return FailureKind.AUTH
    if status in (400, 404, 405, 409, 410, 422):
        return FailureKind.INVALID
    return FailureKind.TRANSIENT


def failure_from_exception(exc: BaseException) -> ProviderFailure:
    """A failed call as a `ProviderFailure`; the message never carries a header or token."""
    from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]
    from kubernetes.config import ConfigException  # type: ignore[import-untyped]
    from urllib3.exceptions import HTTPError

    if isinstance(exc, HeliotropeError):
        kind = FailureKind.TRANSIENT if isinstance(exc, TransientError) else FailureKind.INVALID
        retry = exc.retry_after_s if isinstance(exc, TransientError) else 0.0
        return ProviderFailure(kind, str(exc), retry)
    if isinstance(exc, ConfigException):  # no such context, or a kubeconfig it cannot use
        return ProviderFailure(FailureKind.INVALID, f"kubeconfig: {exc}")
    if isinstance(exc, ApiException):
        status, reason, message = status_of(exc)
        kind = classify(status, reason, message)
        retry = TRANSIENT_RETRY_AFTER_S if kind is FailureKind.TRANSIENT else 0.0
        return ProviderFailure(kind, f"HTTP {status} ({reason or 'no reason'}): {message}", retry)
    if isinstance(exc, HTTPError | OSError):
        return ProviderFailure(
            FailureKind.TRANSIENT,
            f"{type(exc).__name__}: cannot reach the Kubernetes API server",
            TRANSIENT_RETRY_AFTER_S,
        )
    return ProviderFailure(
        FailureKind.TRANSIENT, f"{type(exc).__name__}: {exc}", TRANSIENT_RETRY_AFTER_S
    )


def is_retryable(exc: BaseException) -> bool:
    """Throttling and server trouble are worth repeating at once; nothing else is."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        status, reason, message = status_of(exc)
        return status in _TRANSIENT_HTTP and classify(status, reason, message) is (
            FailureKind.TRANSIENT
        )
    return False


def call_errors() -> tuple[type[BaseException], ...]:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    return (HeliotropeError, ApiException, ConfigException, HTTPError, OSError)


def as_error(exc: BaseException) -> HeliotropeError:
    if isinstance(exc, HeliotropeError):
        return exc
    return failures.as_error("kubernetes", failure_from_exception(exc))
