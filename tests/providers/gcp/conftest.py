"""Fixtures: a fake Compute Engine endpoint per test and a provider pointed at it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from providers.gcp import GcpProvider, naming
from providers.gcp.naming import label_value
from tests.providers.specs import spec_maker

from .fake_compute import FakeCompute

PROJECT = "heliotrope-test"
CLUSTER = "ml-prod"
ZONES = ("us-central1-a", "europe-west4-a")
ZONE = ZONES[0]
T0 = datetime(2024, 5, 1, 17, 0, tzinfo=UTC)
SPOT_A100 = "gcp:us-central1-a:a2-highgpu-1g:spot"
OD_A100 = "gcp:us-central1-a:a2-highgpu-1g:on_demand"
SPOT_L4_EU = "gcp:europe-west4-a:g2-standard-4:spot"

Factory = Callable[..., GcpProvider]


spec = spec_maker(SPOT_A100, cluster=CLUSTER, startup_s=600.0)


@pytest.fixture
def compute() -> Iterator[FakeCompute]:
    fake = FakeCompute(PROJECT, cluster_label=label_value(CLUSTER)).start()
    yield fake
    fake.stop()


@pytest.fixture
def sleeps() -> list[float]:
    """What the provider slept (it never really sleeps in tests)."""
    return []


@pytest.fixture
def make_provider(compute: FakeCompute, sleeps: list[float]) -> Factory:
    from google.auth.credentials import AnonymousCredentials

    def make(**overrides: Any) -> GcpProvider:
        kwargs: dict[str, Any] = {
            "cluster": CLUSTER,
            "project": PROJECT,
            "zones": ZONES,
            "credentials": AnonymousCredentials(),
            "client_options": {"api_endpoint": compute.url},
            "clock": FakeClock(T0),
            "sleep": sleeps.append,
            "billing_endpoint": compute.url,
        }
        kwargs.update(overrides)
        return GcpProvider(**kwargs)

    return make


def put_foreign_instances(compute: FakeCompute) -> dict[str, str]:
    """Instance ids (zone/name) of instances that are not ours."""
    theirs = naming.gang_for(
        project=PROJECT, cluster="other-team", request_id="r-1", zone=ZONE, count=1
    )
    compute.add_instance(ZONE, "instance_other_cluster.json", theirs.name)
    compute.add_instance(ZONE, "instance_unlabelled.json", "notebook-gpu-1")
    # named like ours too: only its missing Heliotrope metadata tells it apart
    compute.add_instance(ZONES[1], "instance_hand_labelled.json", "hel-0123456789abcdef0123")
    return {
        "other cluster": theirs.instance_id,
        "unlabelled": f"{ZONE}/notebook-gpu-1",
        "hand labelled": f"{ZONES[1]}/hel-0123456789abcdef0123",
    }
