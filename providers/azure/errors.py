"""Azure Resource Manager errors as Heliotrope data.

ARM reports a failure in one of two places, and both reach us as azure-core exceptions:

- the HTTP call itself fails: `HttpResponseError` (and its subclasses for 401, 404, 409)
  with the status code and the ODataV4 body `{"error": {"code", "message", "details"}}`,
  e.g. 403 `AuthorizationFailed`, 409 `OperationNotAllowed` (a quota), 429 `TooManyRequests`;
- the call is accepted and the long-running operation it starts ends `Failed`: ARMPolling
  raises `HttpResponseError` whose body is the operation status,
  `{"status": "Failed", "error": {"code": "AllocationFailed", ...}}`.

Codes come from the Azure documentation ("Troubleshoot common Azure deployment errors",
"Resolve errors for SKU not available", "Troubleshoot allocation failures", "Azure Spot
Virtual Machines: error codes"). Order matters: `OperationNotAllowed` is QUOTA when its
message names a quota, and INVALID otherwise. An unknown code is TRANSIENT: retrying a
refused request costs an API call, never a VM.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from orchestrator.errors import HeliotropeError, TransientError
from providers import failures
from providers.base import FailureKind, ProviderFailure

TRANSIENT_RETRY_AFTER_S: Final = 30.0
CAPACITY_RETRY_AFTER_S: Final = failures.CAPACITY_RETRY_AFTER_S

# No machines of that size in the region (or zone) now, for this priority.
CAPACITY_CODES: Final = frozenset(
    {
        "ALLOCATIONFAILED",
        "ZONALALLOCATIONFAILED",
        "OVERCONSTRAINEDALLOCATIONREQUEST",
        "OVERCONSTRAINEDZONALALLOCATIONREQUEST",
        "SKUNOTAVAILABLE",
        "SPOTVMCAPACITYNOTAVAILABLE",
        "ALLOCATIONFAILEDSPOT",
    }
)
QUOTA_CODES: Final = frozenset(
    {"QUOTAEXCEEDED", "OPERATIONNOTALLOWEDQUOTA", "LOWPRIORITYQUOTAEXCEEDED", "SPOTQUOTAEXCEEDED"}
)
TRANSIENT_CODES: Final = frozenset(
    {
        "TOOMANYREQUESTS",
        "SUBSCRIPTIONREQUESTSTHROTTLED",
        "INTERNALSERVERERROR",
        "INTERNALEXECUTIONERROR",
        "SERVICEUNAVAILABLE",
        "RETRYABLEERROR",
        "GATEWAYTIMEOUT",
        "OPERATIONPREEMPTED",
        "CONFLICTINGUSERINPUT",  # another operation on the same resource is in progress
    }
)
AUTH_CODES: Final = frozenset(
    {
        "AUTHORIZATIONFAILED",
        "LINKEDAUTHORIZATIONFAILED",
        "AUTHENTICATIONFAILED",
        "INVALIDAUTHENTICATIONTOKEN",
        "INVALIDAUTHENTICATIONTOKENTENANT",
        "EXPIREDAUTHENTICATIONTOKEN",
        "SUBSCRIPTIONNOTFOUND",
        "MISSINGSUBSCRIPTIONREGISTRATION",
        "DISALLOWEDBYPOLICY",
        "REQUESTDISALLOWEDBYPOLICY",
        "MARKETPLACEPURCHASEELIGIBILITYFAILED",
    }
)
INVALID_CODES: Final = frozenset(
    {
        "INVALIDPARAMETER",
        "INVALIDREQUESTCONTENT",
        "INVALIDTEMPLATE",
        "BADREQUEST",
        "NOTFOUND",
        "RESOURCENOTFOUND",
        "RESOURCEGROUPNOTFOUND",
        "IMAGENOTFOUND",
        "PLATFORMIMAGENOTFOUND",
        "OPERATIONNOTALLOWED",
        "PRECONDITIONFAILED",
        "PROPERTYCHANGENOTALLOWED",
        "INVALIDRESOURCEREFERENCE",
    }
)
_TRANSIENT_HTTP: Final = frozenset({408, 429, 500, 502, 503, 504})
_INVALID_HTTP: Final = frozenset({400, 404, 405, 409, 412})


def _norm(code: str) -> str:
    return code.strip().upper().replace("_", "")


def classify(
    codes: Iterable[str], message: str = "", http_status: int | None = None
) -> FailureKind:
    """The failure kind of an ARM error from its codes, message and HTTP status.

    >>> classify(["OperationNotAllowed"], "exceeding approved Total Regional Cores quota", 409)
    <FailureKind.QUOTA: 'quota'>
    """
    found = {_norm(c) for c in codes if c}
    text = message.lower()
    if found & CAPACITY_CODES:
        return FailureKind.CAPACITY
    if found & QUOTA_CODES or (("OPERATIONNOTALLOWED" in found or not found) and "quota" in text):
        return FailureKind.QUOTA
    if found & TRANSIENT_CODES or http_status == 429:
        return FailureKind.TRANSIENT
    if found & AUTH_CODES or http_status in (401, 403):
        return FailureKind.AUTH
    if found & INVALID_CODES or http_status in _INVALID_HTTP:
        return FailureKind.INVALID
    return FailureKind.TRANSIENT


def _retry_after_s(kind: FailureKind, response: object) -> float:
    return failures.retry_after_s(kind, response, transient_s=TRANSIENT_RETRY_AFTER_S)


def error_codes(exc: BaseException) -> tuple[list[str], str]:
    """(codes, message) of an azure-core `HttpResponseError`: the ODataV4 error code and
    those of its details (an `OperationNotAllowed` often says `QuotaExceeded` inside)."""
    error = getattr(exc, "error", None)
    codes: list[str] = []
    message = ""
    if error is not None:
        code = getattr(error, "code", None)
        if isinstance(code, str):
            codes.append(code)
        text = getattr(error, "message", None)
        message = text if isinstance(text, str) else ""
        for detail in getattr(error, "details", None) or ():
            detail_code = getattr(detail, "code", None)
            if isinstance(detail_code, str):
                codes.append(detail_code)
    if not message:
        message = str(getattr(exc, "reason", "") or type(exc).__name__)
    return codes, message


def failure_from_exception(exc: BaseException) -> ProviderFailure:
    """A failed call (HTTP error, failed operation, connection problem, credentials) as a
    `ProviderFailure`. The message carries the status, the codes and ARM's message; never a
    header or a token."""
    from azure.core import exceptions as az

    if isinstance(exc, HeliotropeError):
        kind = FailureKind.TRANSIENT if isinstance(exc, TransientError) else FailureKind.INVALID
        retry = exc.retry_after_s if isinstance(exc, TransientError) else 0.0
        return ProviderFailure(kind, str(exc), retry)
    if isinstance(exc, az.ServiceRequestError | az.ServiceResponseError):
        return ProviderFailure(
            FailureKind.TRANSIENT,
            f"{type(exc).__name__}: cannot reach Azure Resource Manager",
            TRANSIENT_RETRY_AFTER_S,
        )
    if isinstance(exc, az.ClientAuthenticationError) and exc.status_code is None:
        # azure-identity could not get a token at all (no credential, or it was refused)
        return ProviderFailure(
            FailureKind.AUTH,
            f"{type(exc).__name__}: Azure credentials were refused or not found "
            "(see docs/providers.md, Azure)",
        )
    if isinstance(exc, az.HttpResponseError):
        status = exc.status_code
        codes, message = error_codes(exc)
        kind = classify(codes, message, status)
        label = ", ".join(dict.fromkeys(codes)) or "no code"
        where = f"HTTP {status}" if status is not None else type(exc).__name__
        return ProviderFailure(
            kind, f"{where} ({label}): {message}", _retry_after_s(kind, exc.response)
        )
    return ProviderFailure(
        FailureKind.TRANSIENT, f"{type(exc).__name__}: {exc}", TRANSIENT_RETRY_AFTER_S
    )


def is_retryable(exc: BaseException) -> bool:
    """True for a call worth repeating at once: throttling (429), server trouble (5xx) and
    dropped connections. Capacity, quota, auth and invalid requests are answered by the
    policy or a person, not by repeating."""
    from azure.core import exceptions as az

    if isinstance(exc, az.ServiceRequestError | az.ServiceResponseError):
        return True
    if isinstance(exc, az.HttpResponseError) and exc.status_code in _TRANSIENT_HTTP:
        codes, message = error_codes(exc)
        return classify(codes, message, exc.status_code) is FailureKind.TRANSIENT
    return False


def as_error(failure: ProviderFailure) -> HeliotropeError:
    """A failure as the exception listing, terminating and polling raise."""
    return failures.as_error("azure", failure)
