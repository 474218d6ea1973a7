"""Calling the field's own client libraries (gridstatus, entsoe-py) with our fault handling.

Those libraries do their own HTTP and raise their own exceptions. `call` runs one library
call and maps what comes out to the errors of `errors`, retrying the transient ones with
tenacity through the injected sleep (so tests never sleep):

- ``requests.HTTPError`` with a status: 401/403 -> `AuthFailed`, 429/5xx ->
  `SourceUnavailable` (retried), other 4xx -> `RequestRejected`;
- ``requests.Timeout`` / ``ConnectionError`` -> `SourceUnavailable` (retried);
- the same of urllib (``pandas.read_csv(url)``, which gridstatus' MISO uses);
- an exception whose text says ``HTTP <status>`` (gridstatus' CAISO report does that)
  -> as its status;
- anything else (``KeyError``, ``ValueError`` of a parser, ...) -> `MalformedResponse`
  naming the call and the exception type.

Exception texts of requests may hold the URL with its query (ENTSO-E's token): they are never
shown or chained, and the library's loggers get the redacting filter of `http`.

What a library prints to stdout (gridstatus' ISO-NE reader prints its retries) is kept out
of the command's output and logged at DEBUG.

`require` imports an optional library or raises an `InputError` naming the extra that
installs it (``pip install 'heliotrope[grid]'``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import re
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Final, TypeVar

import tenacity

from orchestrator.errors import HeliotropeError, InputError
from orchestrator.signals.sources.errors import (
    AuthFailed,
    MalformedResponse,
    RequestRejected,
    SourceUnavailable,
)
from orchestrator.signals.sources.http import REDACTOR

logger = logging.getLogger(__name__)

T = TypeVar("T")
ATTEMPTS: Final = 4
_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")
# Loggers of the libraries: the redacting filter goes on each (a filter on a logger applies
# to the records created on that very logger).
LIBRARY_LOGGERS: Final = ("gridstatus", "entsoe", "entsoe.entsoe", "entsoe.decorators")


class MissingLibrary(InputError):
    """An optional client library is not installed; the message names the extra."""

    def __init__(self, source: str, module: str, extra: str) -> None:
        super().__init__(
            source,
            "client library",
            f"the {module!r} package (the {extra!r} extra)",
            got="not installed",
            fix=f"pip install 'heliotrope[{extra}]' or leave the {source!r} source out",
        )
        self.source = source
        self.module = module
        self.extra = extra


def require(source: str, module: str, extra: str) -> ModuleType:
    """`module` imported, or `MissingLibrary`."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        raise MissingLibrary(source, module.split(".", maxsplit=1)[0], extra) from None
    for name in LIBRARY_LOGGERS:
        lg = logging.getLogger(name)
        if REDACTOR not in lg.filters:
            lg.addFilter(REDACTOR)
    quiet = logging.getLogger("gridstatus")
    if quiet.level == logging.DEBUG:  # gridstatus logs every URL to its own stderr handler
        quiet.setLevel(logging.WARNING)
    return mod


def _status_error(source: str, what: str, status: int, hint: str) -> HeliotropeError:
    if status in (401, 403):
        return AuthFailed(source, what, status, hint)
    if status == 429:
        return SourceUnavailable(source, what, "throttled (HTTP 429)")
    if status >= 500:
        return SourceUnavailable(source, what, f"HTTP {status}")
    return RequestRejected(source, what, status)


def classify(exc: BaseException, source: str, what: str, hint: str = "") -> HeliotropeError:
    """The error of ours that `exc` (raised by a library call) stands for."""
    if isinstance(exc, HeliotropeError):
        return exc
    return (
        _transport_error(exc, source, what, hint)
        or _text_error(exc, source, what, hint)
        or MalformedResponse(source, what, f"the client library failed ({type(exc).__name__})")
    )


def _transport_error(
    exc: BaseException, source: str, what: str, hint: str
) -> HeliotropeError | None:
    """An HTTP status, timeout or connection error of urllib or requests, mapped."""
    import urllib.error

    import requests

    if isinstance(exc, urllib.error.HTTPError):  # pandas.read_csv(url) goes through urllib
        return _status_error(source, what, int(exc.code), hint)
    if isinstance(exc, urllib.error.URLError | TimeoutError | ConnectionError):
        return SourceUnavailable(source, what, type(exc).__name__)
    if isinstance(exc, requests.HTTPError):
        response = exc.response
        status = int(response.status_code) if response is not None else 0
        if status:
            return _status_error(source, what, status, hint)
        return SourceUnavailable(source, what, "HTTPError")
    if isinstance(exc, requests.Timeout):
        return SourceUnavailable(source, what, "timed out")
    if isinstance(exc, requests.RequestException):
        return SourceUnavailable(source, what, type(exc).__name__)
    return None


def _text_error(exc: BaseException, source: str, what: str, hint: str) -> HeliotropeError | None:
    """What a library says only in its message (gridstatus' retries, an "HTTP 503")."""
    text = str(exc) if isinstance(exc, ValueError | RuntimeError) else ""
    if text.startswith("Error: Failed after"):  # gridstatus PJM: throttled or timed out
        return SourceUnavailable(source, what, "throttled or timed out")
    if "Check if ISONE is down" in text:  # gridstatus ISO-NE: no CSV after its retries
        return SourceUnavailable(source, what, "no CSV answer (down, or not published)")
    m = _HTTP_STATUS.search(text)
    if m is not None:
        return _status_error(source, what, int(m.group(1)), hint)
    return None


def call(
    source: str,
    what: str,
    fn: Callable[[], T],
    *,
    sleep: Callable[[float], None],
    attempts: int = ATTEMPTS,
    hint: str = "",
    initial_wait_s: float = 1.0,
) -> T:
    """``fn()``, its failures mapped by `classify`; `SourceUnavailable` retried with
    exponential backoff (waits through `sleep`)."""

    def once() -> T:
        printed = io.StringIO()
        try:
            # gridstatus prints retry notes to stdout (ISO-NE): keep `--json` output clean
            with contextlib.redirect_stdout(printed), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the library's own deprecations
                return fn()
        except Exception as exc:  # a library raises many types; `classify` sorts them
            raise classify(exc, source, what, hint) from None
        finally:
            if printed.getvalue().strip():
                logger.debug(
                    "%s: %s: the library printed %r", source, what, printed.getvalue()[:300]
                )

    def log(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait_s = state.next_action.sleep if state.next_action is not None else 0.0
        logger.warning(
            "%s: %s: %s (attempt %d of %d); retrying in %.1f s",
            source,
            what,
            exc.reason if isinstance(exc, SourceUnavailable) else type(exc).__name__,
            state.attempt_number,
            attempts,
            wait_s,
        )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(SourceUnavailable),
        stop=tenacity.stop_after_attempt(attempts),
        wait=tenacity.wait_exponential(multiplier=initial_wait_s, max=30.0),
        sleep=sleep,
        before_sleep=log,
        reraise=True,
    )
    return retrying(once)
