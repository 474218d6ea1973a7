"""`library.classify`: what a client library raises becomes one error of ours, transient
(retried, a gap) or permanent, whatever the library (urllib, requests, gridstatus texts)."""

from __future__ import annotations

import email.message
import io
import urllib.error

import pytest
import requests

from orchestrator.errors import InputError
from orchestrator.signals.sources.errors import (
    AuthFailed,
    MalformedResponse,
    RequestRejected,
    SourceUnavailable,
)
from orchestrator.signals.sources.library import classify


def _urllib(status: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(
        "https://example.test/x.csv", status, "x", email.message.Message(), io.BytesIO()
    )


def _requests(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(response=response)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_urllib(503), SourceUnavailable),
        (_urllib(404), RequestRejected),
        (_urllib(403), AuthFailed),
        (urllib.error.URLError("no route"), SourceUnavailable),
        (ConnectionError("reset"), SourceUnavailable),
        (_requests(429), SourceUnavailable),
        (_requests(401), AuthFailed),
        (_requests(400), RequestRejected),
        (requests.HTTPError(), SourceUnavailable),  # no response: the transport failed
        (requests.Timeout(), SourceUnavailable),
        (requests.ConnectionError(), SourceUnavailable),
        (ValueError("Error: Failed after 3 attempts"), SourceUnavailable),  # gridstatus PJM
        (RuntimeError("Check if ISONE is down"), SourceUnavailable),
        (RuntimeError("server said HTTP 502 twice"), SourceUnavailable),
        (ValueError("got HTTP 404"), RequestRejected),
        (ValueError("columns differ"), MalformedResponse),
        (KeyError("price"), MalformedResponse),
    ],
)
def test_each_failure_maps_to_one_error_of_ours(exc: BaseException, expected: type) -> None:
    got = classify(exc, "caiso-prices", "day-ahead prices 2024-03-10")
    assert type(got) is expected
    assert "caiso-prices" in str(got)


def test_our_own_errors_pass_through() -> None:
    ours = InputError("caiso-prices", "node", "a node id", got="none")
    assert classify(ours, "caiso-prices", "x") is ours


def test_an_unknown_failure_names_the_call_and_the_type_only() -> None:
    got = classify(ValueError("token=SECRET123 in the url"), "pjm-prices", "lmp 2024-03-10")
    assert "lmp 2024-03-10" in str(got) and "ValueError" in str(got)
    assert "SECRET123" not in str(got)
