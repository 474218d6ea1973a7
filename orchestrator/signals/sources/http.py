"""HTTP at the signal edge: timeouts, retries with backoff, and no credential in any log line.

`HttpClient.get` returns the body of a 2xx answer and maps everything else to one error of
`errors`: 401/403 -> `AuthFailed`, 429/5xx/timeouts/connection errors -> `SourceUnavailable`
(retried first), other 4xx -> `RequestRejected`. Retries use tenacity (``reraise=True``)
with exponential backoff and jitter, honour ``Retry-After`` (capped), and wait through an
injected `sleep`, so tests never sleep.

Credentials travel in headers where the API allows it; two APIs (ENTSO-E, EIA) want them in
the query string, which urllib3 logs at DEBUG level. Every secret a request carries is added
to `REDACTOR` (a `redact.Redactor`), a logging filter on the urllib3 loggers and on this
package's loggers that rewrites such records, and no message of ours shows a query string
or an exception text of requests (which may include the URL).
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import tenacity

from orchestrator.signals.sources.errors import AuthFailed, RequestRejected, SourceUnavailable
from orchestrator.signals.sources.redact import LOG_PATTERNS, Redactor

if TYPE_CHECKING:
    import requests

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 5.0
READ_TIMEOUT_S: Final = 30.0
USER_AGENT: Final = "heliotrope-signals/0.1"
MAX_RETRY_AFTER_S: Final = 120.0


# Environment variables whose values are secrets (the local provider drops the same names).
SECRET_NAME: Final = re.compile(
    r"SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY|AUTH",
    re.IGNORECASE,
)

REDACTOR: Final = Redactor(patterns=LOG_PATTERNS)


def redact_logs(environ: Mapping[str, str] | None = None) -> None:
    """Every record any handler of the root logger writes goes through `REDACTOR` (botocore,
    urllib3, google-auth and ours alike), which knows the values of the environment's
    secret-named variables. The one redactor of the command line (`heliotrope -v`)."""
    env = os.environ if environ is None else environ
    REDACTOR.add(v for k, v in env.items() if SECRET_NAME.search(k) and len(v) >= 8)
    for handler in logging.getLogger().handlers:
        if REDACTOR not in handler.filters:
            handler.addFilter(REDACTOR)


_INSTALLED: set[str] = set()
_LOGGERS: Final = (
    "urllib3",
    "urllib3.connectionpool",
    "requests",
    "orchestrator.signals",
    "orchestrator.signals.sources",
    "orchestrator.signals.poll",
)


def install_redactor() -> None:
    """Attach `REDACTOR` to the urllib3 / requests loggers and to ours (idempotent). A filter
    on a logger applies to records created on that very logger, so each is named."""
    for name in _LOGGERS:
        if name not in _INSTALLED:
            logging.getLogger(name).addFilter(REDACTOR)
            _INSTALLED.add(name)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("orchestrator.signals") and name not in _INSTALLED:
            logging.getLogger(name).addFilter(REDACTOR)
            _INSTALLED.add(name)


def safe_url(url: str) -> str:
    """scheme://host/path, without query string or user info."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _retry_after_s(headers: Mapping[str, str]) -> float:
    raw = headers.get("Retry-After") or headers.get("retry-after") or ""
    try:
        return min(max(float(raw), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        return 0.0  # an HTTP date, or junk: back off as usual


class HttpClient:
    """One requests session with timeouts and retries, shared by the sources of a poll.

    `sleep` is how retries wait (a `Clock.sleep`, or a no-op in tests); `attempts` counts
    the first try. `session` may be any object with requests' ``Session.request``.
    """

    def __init__(
        self,
        *,
        session: requests.Session | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        read_timeout_s: float = READ_TIMEOUT_S,
        attempts: int = 4,
        initial_wait_s: float = 1.0,
        max_wait_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self._session = session
        self._timeout = (connect_timeout_s, read_timeout_s)
        self._attempts = attempts
        self._initial_wait_s = initial_wait_s
        self._max_wait_s = max_wait_s
        self._sleep = sleep
        self._jitter = jitter
        self.requests_made = 0
        install_redactor()

    def _get_session(self) -> requests.Session:
        if self._session is None:
            import requests

            self._session = requests.Session()
            self._session.headers["User-Agent"] = USER_AGENT
        return self._session

    def get(
        self,
        source: str,
        url: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        secrets: Iterable[str] = (),
        what: str | None = None,
        auth_hint: str = "",
    ) -> HttpResponse:
        """GET `url`; the body of a 2xx answer, else one of the errors of `errors`."""
        secret_list = [s for s in secrets if s]
        if auth is not None:
            secret_list.extend(auth)
        REDACTOR.add(secret_list)
        label = what or f"GET {safe_url(url)}"

        def once() -> HttpResponse:
            return self._once(source, label, url, params, headers, auth, auth_hint)

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            exponent = max(0, int(state.attempt_number) - 1)
            backoff = float(min(self._max_wait_s, self._initial_wait_s * 2.0**exponent))
            backoff += float(self._jitter()) * self._initial_wait_s
            if isinstance(exc, SourceUnavailable) and exc.retry_after_s > 0:
                return max(float(exc.retry_after_s), backoff)
            return backoff

        def log(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            reason = exc.reason if isinstance(exc, SourceUnavailable) else type(exc).__name__
            wait_s = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "%s: %s: %s (attempt %d of %d); retrying in %.1f s",
                source,
                label,
                reason,
                state.attempt_number,
                self._attempts,
                wait_s,
            )

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(SourceUnavailable),
            stop=tenacity.stop_after_attempt(self._attempts),
            wait=wait,
            sleep=self._sleep,
            before_sleep=log,
            reraise=True,
        )
        return retrying(once)

    def _once(
        self,
        source: str,
        label: str,
        url: str,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        auth: tuple[str, str] | None,
        auth_hint: str,
    ) -> HttpResponse:
        import requests

        self.requests_made += 1
        try:
            response = self._get_session().request(
                "GET",
                url,
                params=dict(params or {}),
                headers=dict(headers or {}),
                auth=auth,
                timeout=self._timeout,
                allow_redirects=True,
            )
        except requests.Timeout:
            # No chaining: a requests exception's text may hold the URL and its query.
            raise SourceUnavailable(source, label, "timed out") from None
        except requests.RequestException as exc:
            raise SourceUnavailable(source, label, type(exc).__name__) from None
        status = int(response.status_code)
        headers_out = {str(k): str(v) for k, v in response.headers.items()}
        if 200 <= status < 300:
            return HttpResponse(status, response.content, headers_out)
        if status in (401, 403):
            raise AuthFailed(source, label, status, auth_hint)
        if status == 429 or status >= 500:
            reason = "throttled (HTTP 429)" if status == 429 else f"HTTP {status}"
            raise SourceUnavailable(
                source, label, reason, retry_after_s=_retry_after_s(headers_out)
            )
        raise RequestRejected(source, label, status)
