"""What the cloud adapters share in turning a cloud's error into Heliotrope's: the retry-after
of a failure and the exception raised by the calls that have no error channel of their own
(`list_instances`, `terminate`, `poll_events`). Each adapter's errors.py keeps what is its
cloud's own: which codes mean what."""

from __future__ import annotations

from typing import Final

from orchestrator.errors import HeliotropeError, PermanentError, TransientError
from providers.base import FailureKind, ProviderFailure

CAPACITY_RETRY_AFTER_S: Final = 0.0  # the policy moves elsewhere; it decides when to return


def retry_after_s(kind: FailureKind, response: object, *, transient_s: float) -> float:
    """How long to wait before asking again: a transient failure the response's
    `Retry-After` header (else `transient_s`), a capacity failure not at all (the policy
    decides), any other never by itself (0)."""
    if kind is FailureKind.CAPACITY:
        return CAPACITY_RETRY_AFTER_S
    if kind is not FailureKind.TRANSIENT:
        return 0.0
    headers = getattr(response, "headers", None)
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(float(value), 0.0) if value is not None else transient_s
    except (TypeError, ValueError):
        return transient_s


def as_error(cloud: str, failure: ProviderFailure) -> HeliotropeError:
    """A failure as the exception listing, terminating and polling raise: transient (and
    capacity) ones as `TransientError`, the rest as `PermanentError`."""
    if failure.kind in (FailureKind.TRANSIENT, FailureKind.CAPACITY):
        return TransientError(f"{cloud}: {failure.message}", retry_after_s=failure.retry_after_s)
    return PermanentError(f"{cloud} ({failure.kind.value}): {failure.message}")
