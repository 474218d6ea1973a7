"""Fixtures: a fake ARM endpoint per test and a provider pointed at it through the SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from providers.azure import AzureProvider
from tests.providers.azure.fake_arm import FakeArm, FakeCredential
from tests.providers.azure.support import (
    CLUSTER,
    CONFIG,
    REGIONS,
    RESOURCE_GROUP,
    SUBSCRIPTION,
    T0,
    Factory,
)


@pytest.fixture
def arm() -> Iterator[FakeArm]:
    fake = FakeArm(SUBSCRIPTION, RESOURCE_GROUP).start()
    yield fake
    fake.stop()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make_provider(arm: FakeArm, sleeps: list[float]) -> Factory:
    def make(**overrides: Any) -> AzureProvider:
        kwargs: dict[str, Any] = {
            "cluster": CLUSTER,
            "subscription_id": SUBSCRIPTION,
            "resource_group": RESOURCE_GROUP,
            "regions": REGIONS,
            "credential": FakeCredential(),
            "transport": arm.transport(),
            "launch_config": CONFIG,
            "clock": FakeClock(T0),
            "sleep": sleeps.append,
            "prices_endpoint": arm.url,
        }
        kwargs.update(overrides)
        return AzureProvider(**kwargs)

    return make
