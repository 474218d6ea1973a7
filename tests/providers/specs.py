"""The launch spec the adapter suites launch (each suite's `spec()` gives its defaults)."""

from __future__ import annotations

from collections.abc import Callable

from providers.base import LaunchSpec


def spec_maker(
    offer: str,
    *,
    cluster: str,
    startup_s: float,
    entrypoint: tuple[str, ...] = ("python", "train.py"),
) -> Callable[..., LaunchSpec]:
    """`spec(offer=<default>, job=, count=, env=, entrypoint=, startup_s=, cluster=)` with
    this suite's defaults."""
    defaults = (offer, cluster, startup_s, entrypoint)

    def spec(
        offer: str = defaults[0],
        *,
        job: str = "job-1",
        count: int = 1,
        env: dict[str, str] | None = None,
        entrypoint: tuple[str, ...] = defaults[3],
        startup_s: float = defaults[2],
        cluster: str = defaults[1],
    ) -> LaunchSpec:
        return LaunchSpec(
            job_id=job,
            offer_id=offer,
            cluster=cluster,
            startup_s=startup_s,
            count=count,
            entrypoint=entrypoint,
            env=env or {},
        )

    return spec
