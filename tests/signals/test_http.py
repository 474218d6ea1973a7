"""The HTTP edge: retries with backoff on 429/5xx (no real sleeping), errors that name the
source, timeouts, and never a credential in a log line or an exception message."""

from __future__ import annotations

import logging

import pytest

from orchestrator.signals.sources.carbon import ElectricityMaps
from orchestrator.signals.sources.errors import (
    AuthFailed,
    MissingCredential,
    RequestRejected,
    SourceUnavailable,
)
from orchestrator.signals.sources.http import HttpClient
from orchestrator.signals.sources.power import Eia930, Entsoe
from tests.signals.conftest import CREDS, NOW, Sleeps, make_ctx
from tests.signals.server import FixtureServer, Reply

EM_HISTORY = r"/carbon-intensity/history$"


def test_429_then_200_retries_after_the_servers_wait(server: FixtureServer, sleeps: Sleeps) -> None:
    server.add(
        EM_HISTORY,
        Reply(429, b'{"message": "rate limited"}', {"Retry-After": "7"}),
        Reply.file("em_history_DE.json"),
    )
    source = ElectricityMaps(make_ctx(server, sleeps))
    frame = source.read(["DE"], NOW.replace(hour=0), NOW)
    assert len(frame) > 0
    assert len(server.hits(EM_HISTORY)) == 2
    assert sleeps == [7.0]  # Retry-After honoured; nothing actually slept


def test_500_until_attempts_run_out_is_transient(server: FixtureServer, sleeps: Sleeps) -> None:
    server.add(EM_HISTORY, Reply(500, b"oops"))
    source = ElectricityMaps(make_ctx(server, sleeps))
    with pytest.raises(SourceUnavailable) as err:
        source.read(["DE"], NOW.replace(hour=0), NOW)
    assert len(server.hits(EM_HISTORY)) == 4
    assert sleeps == [1.0, 2.0, 4.0]  # exponential backoff, injected sleep
    assert "electricitymaps" in str(err.value) and "HTTP 500" in str(err.value)


def test_404_is_rejected_without_retry(server: FixtureServer) -> None:
    server.add(EM_HISTORY, Reply(404, b'{"message": "zone not found"}'))
    with pytest.raises(RequestRejected, match="HTTP 404"):
        ElectricityMaps(make_ctx(server)).read(["XX"], NOW.replace(hour=0), NOW)
    assert len(server.hits(EM_HISTORY)) == 1


def test_timeout_is_transient(server: FixtureServer, sleeps: Sleeps) -> None:
    server.add(EM_HISTORY, Reply(200, b"{}", delay_s=0.6))
    ctx = make_ctx(server, sleeps)
    ctx.http = HttpClient(sleep=sleeps, read_timeout_s=0.2, attempts=2, jitter=lambda: 0.0)
    with pytest.raises(SourceUnavailable, match="timed out"):
        ElectricityMaps(ctx).read(["DE"], NOW.replace(hour=0), NOW)


def test_missing_credential_names_the_variable(server: FixtureServer) -> None:
    ctx = make_ctx(server, creds={})
    with pytest.raises(MissingCredential, match="ELECTRICITYMAPS_TOKEN"):
        ElectricityMaps(ctx).read(["DE"], NOW.replace(hour=0), NOW)
    assert server.requests == []


def test_credential_from_the_environment_travels_in_a_header(server: FixtureServer) -> None:
    server.add(EM_HISTORY, Reply.file("em_history_DE.json"))
    ctx = make_ctx(server, creds={})
    ctx.env = {"ELECTRICITYMAPS_TOKEN": "env-token-77aa1"}
    ElectricityMaps(ctx).read(["DE"], NOW.replace(hour=0), NOW)
    (req,) = server.hits(EM_HISTORY)
    assert req.headers.get("auth-token") == "env-token-77aa1"
    assert "env-token-77aa1" not in str(req.query)


@pytest.mark.parametrize(
    ("source_cls", "route", "key", "secret"),
    [
        (ElectricityMaps, EM_HISTORY, "DE", CREDS["ELECTRICITYMAPS_TOKEN"]),
        (Entsoe, r"^/$", "DE", CREDS["ENTSOE_TOKEN"]),  # token in the query string
        (Eia930, r"/fuel-type-data/data/$", "US-CAL-CISO", CREDS["EIA_API_KEY"]),
    ],
)
def test_no_credential_in_logs_or_errors_on_401(
    server: FixtureServer,
    caplog: pytest.LogCaptureFixture,
    source_cls: type,
    route: str,
    key: str,
    secret: str,
) -> None:
    server.add(route, Reply(401, f'{{"message": "bad token {secret}"}}'))
    caplog.set_level(logging.DEBUG)  # urllib3 logs request lines, query string included
    # ... unless a library set urllib3's own level (the kubernetes client's Configuration
    # sets it to WARNING): the test must see those lines whatever ran before it.
    caplog.set_level(logging.DEBUG, logger="urllib3")
    source = source_cls(make_ctx(server))
    with pytest.raises(AuthFailed) as err:
        source.read([key], NOW.replace(hour=0), NOW)
    assert server.requests, "the request was made"
    assert secret not in str(err.value)
    assert secret not in repr(err.value.__cause__) and err.value.__cause__ is None
    assert secret not in caplog.text
    assert "HTTP 401" in str(err.value)
    if source_cls is Entsoe:
        assert server.requests[0].q("securityToken") == secret  # it did travel
        assert "securityToken=***" in caplog.text  # and urllib3's line was redacted


def test_connection_refused_is_transient_and_clean(sleeps: Sleeps) -> None:
    http = HttpClient(sleep=sleeps, attempts=2, connect_timeout_s=0.5, jitter=lambda: 0.0)
    secret = "query-secret-1234"
    with pytest.raises(SourceUnavailable) as err:
        http.get("eia930", "http://127.0.0.1:9/x", params={"api_key": secret}, secrets=(secret,))
    assert secret not in str(err.value) and err.value.__cause__ is None
    assert len(sleeps) == 1
