"""The one secret redactor: what any log line, error message or check row shows passes
through a `Redactor`.

A `Redactor` replaces by ``***``

- the secret values it knows (given when it is made or `add`-ed later; 4 characters or
  more, the longest first, so a secret that contains another is hidden whole), and
- anything matching one of its `patterns`: the shapes of credentials (an AWS access key id)
  whether or not the value was registered. A pattern with a group keeps its first group,
  so ``Authorization: <value>`` reads ``Authorization: ***``.

It is a `logging.Filter` too: on a logger or handler it rewrites every record it sees
(`signals.sources.http.REDACTOR`, the process-wide one, sits on the urllib3, requests and
signal loggers and on the root logger's handlers). `heliotrope providers check` makes one
of its own from the registered clouds' secrets and patterns (`live.clouds.checks`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Final

MASK: Final = "***"
MIN_SECRET_CHARS: Final = 4  # shorter values would blank out ordinary words

# Shaped like an AWS access key id, and the values of signed-request headers botocore logs
# at DEBUG: what the process-wide redactor hides whether or not the value was registered.
AWS_KEY_ID: Final = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
SIGNED_HEADER: Final = re.compile(
    r"((?:X-Amz-Security-Token|Authorization|x-goog-api-key|auth-token)['\"]?\s*[:=]\s*"
    r"['\"]?(?:b['\"])?)[^'\",}\s]+",
    re.IGNORECASE,
)
LOG_PATTERNS: Final = (AWS_KEY_ID, SIGNED_HEADER)


class Redactor(logging.Filter):
    """Replaces known secrets and credential-shaped text by ``***`` (see the module)."""

    def __init__(
        self, secrets: Iterable[str | None] = (), patterns: Iterable[re.Pattern[str]] = ()
    ) -> None:
        super().__init__()
        self._secrets: tuple[str, ...] = ()
        self._patterns = tuple(patterns)
        self._lock = threading.Lock()
        self.add(secrets)

    def add(self, secrets: Iterable[str | None]) -> None:
        """Know these values too (empty and short ones are ignored)."""
        fresh = {s for s in secrets if s and len(s) >= MIN_SECRET_CHARS}
        with self._lock:
            self._secrets = tuple(sorted(fresh | set(self._secrets), key=len, reverse=True))

    def secrets(self) -> tuple[str, ...]:
        return self._secrets

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        for pattern in self._patterns:
            text = pattern.sub(_mask_keeping_prefix if pattern.groups else MASK, text)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to logging's own handling
            return True
        clean = self(message)
        if clean != message:
            record.msg = clean
            record.args = None
        return True


def _mask_keeping_prefix(match: re.Match[str]) -> str:
    return (match.group(1) or "") + MASK
