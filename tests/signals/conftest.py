"""Fixtures of the signal tests: the local fixture server, a source context pointed at it
(no sleeping, fixed clock), and the time the recordings were made."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.signals.sources.base import FixedClock, SourceContext
from orchestrator.signals.sources.http import HttpClient
from tests.signals.server import FixtureServer

NOW = datetime(2024, 3, 31, 4, 0, tzinfo=UTC)  # the recordings end here
CREDS = {
    "ELECTRICITYMAPS_TOKEN": "em-token-5f1c9a77e2",
    "WATTTIME_USERNAME": "heliotrope-test",
    "WATTTIME_PASSWORD": "wt-pass-8d2e61b0",
    "ENTSOE_TOKEN": "entsoe-token-0b7d4c21",
    "EIA_API_KEY": "eia-key-93ac55d1e0",
    "GCP_BILLING_API_KEY": "AIzaSy-gcp-key-4e0a9b",
}


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture(scope="session")
def _server() -> Iterator[FixtureServer]:
    with FixtureServer() as server:
        yield server


@pytest.fixture
def server(_server: FixtureServer) -> Iterator[FixtureServer]:
    _server.reset()
    yield _server
    _server.reset()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def make_ctx(
    server: FixtureServer,
    sleeps: Sleeps | None = None,
    *,
    now: datetime = NOW,
    creds: dict[str, str] | None = None,
    **options: Any,
) -> SourceContext:
    sleep = sleeps if sleeps is not None else Sleeps()
    names = (
        "electricitymaps",
        "uk-carbon",
        "watttime",
        "entsoe-prices",
        "entsoe-generation",
        "eia930",
        "caiso-curtailment",
        "gcp-billing",
    )
    return SourceContext(
        http=HttpClient(sleep=sleep, read_timeout_s=5.0, jitter=lambda: 0.0),
        clock=FixedClock(now),
        credentials=CREDS if creds is None else creds,
        base_urls={
            **{n: server.url for n in names},
            "aws-spot-advisor": f"{server.url}/spot-advisor-data.json",
        },
        env={},
        options=options,
        sleep=sleep,
    )


@pytest.fixture
def ctx(server: FixtureServer, sleeps: Sleeps) -> SourceContext:
    return make_ctx(server, sleeps)
