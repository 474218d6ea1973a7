"""Compute Engine errors as Heliotrope data.

Compute Engine reports a failure in one of two places, and both are mapped here:

- the HTTP call itself fails (google.api_core raises `GoogleAPICallError` with the status
  code, `errors[].reason` from the JSON body and `reason` from a `google.rpc.ErrorInfo`
  detail), e.g. 403 `quotaExceeded`, 403 `forbidden`, 429 `rateLimitExceeded`;
- the call is accepted and the zone operation it returns finishes with
  `error.errors[].code`, e.g. `ZONE_RESOURCE_POOL_EXHAUSTED`, `QUOTA_EXCEEDED`.

Codes come from the Compute Engine documentation ("Troubleshooting VM creation", "Resource
availability", "Handling API errors") and from what SkyPilot's GCP provisioner handles.
Order matters: a 403 that says `quotaExceeded` is QUOTA, not AUTH, and a 403 that says
`rateLimitExceeded` is throttling. An unknown code is TRANSIENT: retrying a refused request
costs an API call, never an instance.

Only `is_retryable` errors are retried, and only at this edge (see `provider._retrying`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from orchestrator.errors import HeliotropeError, TransientError
from providers import failures
from providers.base import FailureKind, ProviderFailure

# Retry hints (seconds) handed to the caller.
TRANSIENT_RETRY_AFTER_S: Final = 30.0
CAPACITY_RETRY_AFTER_S: Final = failures.CAPACITY_RETRY_AFTER_S

# A zone (or region) has no machines of that shape right now.
CAPACITY_CODES: Final = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "REGION_RESOURCE_POOL_EXHAUSTED",
        "RESOURCE_POOL_EXHAUSTED",
        "RESOURCE_EXHAUSTED",
        "RESOURCEEXHAUSTED",
        "STOCKOUT",
        "GPU_STOCKOUT",
        "INSUFFICIENTCAPACITY",
    }
)
# An account limit (GPUs per region, CPUs, in-use addresses ...).
QUOTA_CODES: Final = frozenset({"QUOTA_EXCEEDED", "QUOTAEXCEEDED", "QUOTA_LIMIT_EXCEEDED"})
# Throttling and server-side trouble: try the same call again later.
TRANSIENT_CODES: Final = frozenset(
    {
        "RATELIMITEXCEEDED",
        "USERRATELIMITEXCEEDED",
        "RATE_LIMIT_EXCEEDED",
        "RESOURCE_OPERATION_RATE_EXCEEDED",
        "BACKENDERROR",
        "INTERNAL_ERROR",
        "INTERNALERROR",
        "RESOURCE_NOT_READY",
        "RESOURCENOTREADY",
        "SERVICE_UNAVAILABLE",
    }
)
# Credentials, permissions, a disabled API or billing: a person has to act.
AUTH_CODES: Final = frozenset(
    {
        "FORBIDDEN",
        "INSUFFICIENTPERMISSIONS",
        "PERMISSION_DENIED",
        "IAM_PERMISSION_DENIED",
        "AUTHERROR",
        "UNAUTHORIZED",
        "ACCESSNOTCONFIGURED",
        "SERVICE_DISABLED",
        "BILLING_DISABLED",
    }
)
# The request itself is wrong (a bad field, an image or machine type that does not exist).
INVALID_CODES: Final = frozenset(
    {
        "INVALID",
        "INVALID_FIELD_VALUE",
        "INVALID_USAGE",
        "INVALIDPARAMETER",
        "BADREQUEST",
        "REQUIRED",
        "NOTFOUND",
        "RESOURCE_NOT_FOUND",
        "UNSUPPORTED_OPERATION",
        "CONDITIONNOTMET",
    }
)
# Free-text markers, for payloads that carry only a message.
_CAPACITY_TEXT: Final = (
    "does not have enough resources available",
    "resource pool exhausted",
    "zone_resource_pool_exhausted",
)
# gRPC's RESOURCE_EXHAUSTED doubles as "throttled" on an HTTP 429.
_GENERIC_EXHAUSTED: Final = frozenset({"RESOURCE_EXHAUSTED", "RESOURCEEXHAUSTED"})
_TRANSIENT_HTTP: Final = frozenset({408, 429, 500, 502, 503, 504})
_INVALID_HTTP: Final = frozenset({400, 404, 405, 409, 411, 412, 413})


def _norm(code: str) -> str:
    return code.strip().upper()


def classify(
    codes: Iterable[str], message: str = "", http_status: int | None = None
) -> FailureKind:
    """The failure kind of an error from its codes or reasons, message and HTTP status.

    >>> classify(["quotaExceeded"], "Quota 'GPUS_ALL_REGIONS' exceeded", 403)
    <FailureKind.QUOTA: 'quota'>
    """
    found = {_norm(c) for c in codes if c}
    text = message.lower()
    if http_status == 429:  # "Too Many Requests" is throttling, whatever else it says
        found -= _GENERIC_EXHAUSTED
    if found & CAPACITY_CODES or any(marker in text for marker in _CAPACITY_TEXT):
        return FailureKind.CAPACITY
    if found & QUOTA_CODES:
        return FailureKind.QUOTA
    if found & TRANSIENT_CODES:
        return FailureKind.TRANSIENT
    if "quota" in text and "exceeded" in text and http_status != 429:
        return FailureKind.QUOTA
    if found & AUTH_CODES or http_status in (401, 403):
        return FailureKind.AUTH
    if found & INVALID_CODES or http_status in _INVALID_HTTP:
        return FailureKind.INVALID
    return FailureKind.TRANSIENT


def _retry_after_s(kind: FailureKind, response: object) -> float:
    return failures.retry_after_s(kind, response, transient_s=TRANSIENT_RETRY_AFTER_S)


def _api_error_codes(exc: BaseException) -> list[str]:
    codes: list[str] = []
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str):
        codes.append(reason)
    for item in getattr(exc, "errors", ()) or ():
        if isinstance(item, dict):
            for key in ("reason", "code"):
                value = item.get(key)
                if isinstance(value, str):
                    codes.append(value)
    return codes


def _api_error_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    return message if isinstance(message, str) else type(exc).__name__


def failure_from_exception(exc: BaseException) -> ProviderFailure:
    """A failed call (HTTP error, connection problem, credentials) as a `ProviderFailure`.

    The message carries the status, the reasons and the server's message; it never carries
    request headers, so no credential can end up in it.
    """
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as requests_exceptions

    if isinstance(exc, HeliotropeError):
        kind = FailureKind.TRANSIENT if isinstance(exc, TransientError) else FailureKind.INVALID
        retry = exc.retry_after_s if isinstance(exc, TransientError) else 0.0
        return ProviderFailure(kind, str(exc), retry)
    if isinstance(
        exc,
        auth_exceptions.TransportError
        | requests_exceptions.ConnectionError
        | requests_exceptions.Timeout
        | api_exceptions.RetryError,
    ):
        return ProviderFailure(
            FailureKind.TRANSIENT,
            f"{type(exc).__name__}: cannot reach Compute Engine",
            TRANSIENT_RETRY_AFTER_S,
        )
    if isinstance(exc, auth_exceptions.GoogleAuthError):
        return ProviderFailure(
            FailureKind.AUTH,
            f"{type(exc).__name__}: credentials were "
            "refused or not found (see docs/providers.md, GCP)",
        )
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        status = exc.code if isinstance(exc.code, int) else None
        codes = _api_error_codes(exc)
        message = _api_error_message(exc)
        kind = classify(codes, message, status)
        label = ", ".join(dict.fromkeys(codes)) or "no reason"
        return ProviderFailure(
            kind,
            f"HTTP {status} ({label}): {_strip_url(message)}",
            _retry_after_s(kind, exc.response),
        )
    return ProviderFailure(
        FailureKind.TRANSIENT, f"{type(exc).__name__}: {exc}", TRANSIENT_RETRY_AFTER_S
    )


def failure_from_operation(
    errors: Sequence[tuple[str, str]], *, http_status: int | None = None, operation: str = ""
) -> ProviderFailure | None:
    """The failure of a finished zone operation from its `error.errors[]` (code, message)
    pairs; None when it has none (the operation succeeded)."""
    if not errors:
        return None
    codes = [code for code, _ in errors]
    message = "; ".join(f"{code}: {text}" for code, text in errors)
    kind = classify(codes, message, http_status or None)
    where = f"operation {operation}: " if operation else ""
    return ProviderFailure(kind, where + message, _retry_after_s(kind, None))


def is_retryable(exc: BaseException) -> bool:
    """True for a call worth repeating at once: throttling (429, `rateLimitExceeded`),
    server trouble (5xx), timeouts and dropped connections. Capacity, quota, auth and
    invalid requests are answered by the policy or a person, not by repeating."""
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as requests_exceptions

    if isinstance(
        exc,
        auth_exceptions.TransportError
        | requests_exceptions.ConnectionError
        | requests_exceptions.Timeout,
    ):
        return True
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        status = exc.code if isinstance(exc.code, int) else None
        if status not in _TRANSIENT_HTTP and not (
            status == 403 and {_norm(c) for c in _api_error_codes(exc)} & TRANSIENT_CODES
        ):
            return False
        return classify(_api_error_codes(exc), _api_error_message(exc), status) is (
            FailureKind.TRANSIENT
        )
    return False


def as_error(failure: ProviderFailure) -> HeliotropeError:
    """A failure as the exception listing, terminating and polling raise."""
    return failures.as_error("gcp", failure)


def _strip_url(message: str) -> str:
    """google.api_core prefixes messages with "METHOD URL: "; keep the server's words only
    (the URL may carry an API key in other clients, and says nothing useful here)."""
    head, sep, tail = message.partition(": ")
    if sep and head.split(" ", 1)[0] in {"GET", "POST", "DELETE", "PATCH", "PUT"}:
        return tail
    return message
