"""The adapters of the configured clouds, each built by its registry spec
(providers/registry.py `CloudSpec.build`) from its settings section."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.clock import Clock
from orchestrator.live.clouds.settings import CloudSettings
from providers import registry
from providers.base import ComputeProvider
from providers.registry import BuildContext, CloudAccess


def make_providers(
    settings: CloudSettings,
    *,
    clock: Clock,
    access: CloudAccess | None = None,
    clouds: Sequence[str] | None = None,
) -> dict[str, ComputeProvider]:
    """One adapter per configured cloud (or per cloud of `clouds`), by name, each built by
    its registry spec from its settings section."""
    access = access or CloudAccess()
    return {
        name: registry.spec(name).build(
            settings.section(name), build_context(settings, name, clock, access)
        )
        for name in clouds or settings.providers
    }


def build_context(
    settings: CloudSettings, name: str, clock: Clock, access: CloudAccess
) -> BuildContext:
    return BuildContext(
        cluster=settings.cluster, clock=clock, access=access.of(name), sleep=access.sleep
    )
