"""One error root for Heliotrope.

`TransientError` means "try again later" (the caller may retry after `retry_after_s`);
`PermanentError` means retrying cannot help. `InputError` is a permanent error caused by
what a person gave us (a file, a flag, a parameter): its message names where the problem is,
what was expected and how to fix it, and the CLI turns it into exit status 2.
"""

from __future__ import annotations

from typing import Any


class HeliotropeError(Exception):
    """Root of every error Heliotrope raises on purpose."""


class TransientError(HeliotropeError):
    """A failure that may go away: throttling, a timeout, capacity that may come back."""

    def __init__(self, message: str, *, retry_after_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PermanentError(HeliotropeError):
    """A failure that retrying cannot fix."""


class InputError(PermanentError):
    """Bad input from a person. The message says where, what was expected, and the fix.

    For example ``InputError("jobs.yaml", "jobs[2].deadline", "a later time",
    got="2024-01-01", fix="move the deadline later")`` reads "jobs.yaml: jobs[2].deadline:
    expected a later time, got 2024-01-01; fix: move the deadline later".
    """

    def __init__(
        self,
        where: str,
        field: str,
        expected: str,
        *,
        got: object = None,
        fix: str | None = None,
    ) -> None:
        self.where = where
        self.field = field
        self.expected = expected
        self.got = got
        self.fix = fix
        parts = [
            f"{where}: " if where else "",
            f"{field}: " if field else "",
            f"expected {expected}",
        ]
        if got is not None:
            parts.append(f", got {got}")
        if fix:
            parts.append(f"; fix: {fix}")
        super().__init__("".join(parts))


class UnknownNameError(InputError):
    """A name (policy, region, GPU type, ...) that is not known; lists the known ones."""

    def __init__(
        self, what: str, name: str, known: list[str] | tuple[str, ...], where: str = ""
    ) -> None:
        super().__init__(
            where,
            what,
            "one of: " + ", ".join(sorted(known)),
            got=repr(name),
            fix=f"use one of the known {what} names",
        )
        self.name = name
        self.known = tuple(sorted(known))


class Refused(ValueError):
    """Raised by a pydantic validator: the text is what the value should have been (the
    InputError's `expected`, through `expected_of`)."""


def expected_of(error: Any) -> str:
    """What a pydantic error (one of `ValidationError.errors()`) says was expected: a
    validator's `Refused` text, else pydantic's own message."""
    cause = (error.get("ctx") or {}).get("error")
    return str(cause) if isinstance(cause, Refused) else str(error.get("msg", ""))
