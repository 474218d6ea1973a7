"""Errors of the live signal sources, all under the one root (`orchestrator.errors`).

- `MalformedResponse` (permanent): an answer that does not have the documented shape or
  holds an impossible value (NaN, a negative intensity, a missing field). The message names
  the source, the field (``history[3].carbonIntensity``) and why.
- `AuthFailed` (permanent): 401 / 403. A person has to fix the credential.
- `RequestRejected` (permanent): another 4xx (404 for an unknown zone, 400 for a bad query).
- `SourceUnavailable` (transient): 429, 5xx, a timeout or a connection error, after the
  retries at the edge.
- `MissingCredential` (input): the source needs a key that is neither in the environment nor
  passed in; the message names the environment variable.

No message ever holds a credential: URLs are shown without their query string, request
exceptions by their type only, and every message passes through the redactor
(`redact.Redactor`; `poll` applies the process-wide one).
"""

from __future__ import annotations

from orchestrator.errors import InputError, PermanentError, TransientError

MAX_GOT_CHARS = 120


def short(value: object) -> str:
    """A value for an error message: its repr, cut."""
    text = repr(value)
    return text if len(text) <= MAX_GOT_CHARS else text[: MAX_GOT_CHARS - 3] + "..."


class SourceError(Exception):
    """Mixin: the error of one signal source; `source` is its name."""

    source: str = ""


class MalformedResponse(PermanentError, SourceError):
    """The answer of `source` is not what its API documents (see the module docstring)."""

    def __init__(self, source: str, field: str, reason: str) -> None:
        self.source = source
        self.field = field
        self.reason = reason
        where = f"{field}: " if field else ""
        super().__init__(f"{source}: malformed response: {where}{reason}")


class AuthFailed(PermanentError, SourceError):
    """401 or 403: the credential is wrong, expired or lacks the plan for this data."""

    def __init__(self, source: str, what: str, status: int, hint: str = "") -> None:
        self.source = source
        self.status = status
        fix = f"; {hint}" if hint else ""
        super().__init__(f"{source}: {what}: HTTP {status} (not authorized){fix}")


class RequestRejected(PermanentError, SourceError):
    """A 4xx other than 401/403/429: the request itself is wrong (unknown zone, bad range)."""

    def __init__(self, source: str, what: str, status: int, detail: str = "") -> None:
        self.source = source
        self.status = status
        extra = f": {detail}" if detail else ""
        super().__init__(f"{source}: {what}: HTTP {status}{extra}")


class SourceUnavailable(TransientError, SourceError):
    """Throttled, a server error, a timeout or no connection (after the retries)."""

    def __init__(self, source: str, what: str, reason: str, *, retry_after_s: float = 0.0) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {what}: {reason}", retry_after_s=retry_after_s)


class MissingCredential(InputError, SourceError):
    """The source needs a credential that was not given."""

    def __init__(self, source: str, env: str) -> None:
        super().__init__(
            source,
            "credential",
            f"a value in ${env} (or passed in, e.g. from an Airflow connection)",
            got="none",
            fix=f"export {env}=... or leave the {source!r} source out",
        )
        self.source = source
        self.env = env
