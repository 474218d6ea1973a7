"""Fixtures: two fake API servers (an on-premises A100 pool and a GPU cloud with H100
spot and on-demand pools), a kubeconfig naming both, and a provider reading it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from providers.kubernetes import KubernetesProvider
from tests.providers.kubernetes.fake_kube import FakeKube
from tests.providers.kubernetes.support import (
    CLUSTER,
    CONFIG,
    GPUCLOUD,
    ONPREM,
    T0,
    Factory,
    write_kubeconfig,
)


@pytest.fixture
def kube() -> Iterator[dict[str, FakeKube]]:
    fakes = {
        "onprem": FakeKube("nodes_onprem.json").start(),
        "gpucloud": FakeKube("nodes_gpucloud.json", token="other-cluster-token").start(),
    }
    yield fakes
    for fake in fakes.values():
        fake.stop()


@pytest.fixture
def onprem(kube: dict[str, FakeKube]) -> FakeKube:
    return kube["onprem"]


@pytest.fixture
def gpucloud(kube: dict[str, FakeKube]) -> FakeKube:
    return kube["gpucloud"]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def make_provider(
    kube: dict[str, FakeKube], tmp_path: Path, clock: FakeClock, sleeps: list[float]
) -> Factory:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube)

    def make(**overrides: Any) -> KubernetesProvider:
        kwargs: dict[str, Any] = {
            "cluster": CLUSTER,
            "regions": (ONPREM, GPUCLOUD),
            "kubeconfig": str(kubeconfig),
            "launch_config": CONFIG,
            "clock": clock,
            "sleep": sleeps.append,
        }
        kwargs.update(overrides)
        return KubernetesProvider(**kwargs)

    return make
