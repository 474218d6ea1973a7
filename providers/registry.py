"""The cloud registry: every cloud Heliotrope can run on, as one `CloudSpec` each.

A cloud is a package `providers/<cloud>/` with a `spec.py` that defines `SPEC`; the line
naming that module in `SPEC_MODULES` below is the only place outside the package that
knows it. The orchestrator, the CLI, the DAGs and the catalog loop over `specs()`:

- `settings_model`: the pydantic model of its section of the clouds settings
  (`aws:`, `gcp:`, `azure:`, `k8s:` in clouds.yaml);
- `build(section, ctx)`: the `ComputeProvider` of those settings (`BuildContext` carries
  the cluster, the clock and what `CloudAccess` gives this cloud);
- `check(provider, section, ctx)`: `heliotrope providers check`'s rows for it;
- `secrets(section)`, `secret_env`, `secret_patterns`: what its check output must never show;
- `notice_source`: the `HELIOTROPE_NOTICE_SOURCE` of its VMs' preemption notice reader
  (orchestrator/training/notices.py), None where the notice is SIGTERM;
- `geography`, `egress`, `instance_types`: its regions -> grid zones, PUE, zone rule,
  data-transfer prices and instance types, as catalog records (registered with
  `orchestrator.catalog` when the registry loads; the catalog imports no provider);
- `price_sources`, `capacity_sources`: the signal sources of orchestrator/signals/poll.py
  that poll its prices and spot capacity (its family in the signals DAG);
- `connection_id`: the Airflow Connection holding its credentials for those sources;
- `infra`: the infra/ files that grant exactly what the adapter calls.

Spec modules import nothing heavy: cloud SDKs and the adapters are imported inside `build`
and `check`.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel

from orchestrator import catalog
from orchestrator.catalog.network import INTERNET, LOCAL
from orchestrator.clock import Clock
from orchestrator.errors import UnknownNameError
from providers.base import ComputeProvider

#: One line per cloud: the module that defines its `SPEC`.
SPEC_MODULES: Final = (
    "providers.aws.spec",
    "providers.gcp.spec",
    "providers.azure.spec",
    "providers.kubernetes.spec",
)

Result = Literal["ok", "fail", "skip"]
CheckRow = tuple[str, Result, str]  # (check, result, reason): a row of `providers check`
_NAME = re.compile(r"^[a-z][a-z0-9]{1,15}$")


@dataclass(frozen=True)
class CloudAccess:
    """How to reach the clouds, when not by their standard credential chains: per cloud,
    the object its spec's `build` understands (`AwsAccess`, `GcpAccess`, `AzureAccess`,
    `KubeAccess`: an assumed role's session factory, credentials, a test's transport), and
    the sleep retries use (default: the clock's)."""

    clouds: Mapping[str, object] = field(default_factory=dict)
    sleep: Callable[[float], None] | None = None

    def of(self, cloud: str) -> object | None:
        return self.clouds.get(cloud)


@dataclass(frozen=True)
class BuildContext:
    """What a spec's `build` and `check` get besides the cloud's settings section."""

    cluster: str
    clock: Clock
    access: object | None = None  # `CloudAccess.of(cloud)`
    sleep: Callable[[float], None] | None = None


def _no_secrets(section: Any) -> Sequence[str]:
    return ()


@dataclass(frozen=True)
class CloudSpec:
    name: str
    title: str  # for people: "AWS", "Kubernetes"
    settings_model: type[BaseModel]
    build: Callable[[Any, BuildContext], ComputeProvider]
    check: Callable[[Any, Any, BuildContext], list[CheckRow]]
    geography: catalog.CloudGeography | None  # None: regions come from its settings
    egress: catalog.Egress
    infra: tuple[str, ...]
    notice_source: str | None = None
    price_sources: tuple[str, ...] = ()
    capacity_sources: tuple[str, ...] = ()
    connection_id: str | None = None
    secrets: Callable[[Any], Sequence[str]] = _no_secrets
    secret_env: tuple[str, ...] = ()  # environment variables whose values are never printed
    secret_patterns: tuple[re.Pattern[str], ...] = ()  # shapes of its credentials
    # Its instance types -> (GPU type, count), for a cloud the catalog does not know
    # (`catalog.register_instance_types`); None: the catalog's own table, or none needed.
    instance_types: catalog.InstanceParser | None = None

    @property
    def signal_sources(self) -> tuple[str, ...]:
        return (*self.price_sources, *self.capacity_sources)

    def regions(self) -> tuple[str, ...]:
        """The catalog regions of this cloud (none for a cloud whose regions are its
        settings', such as Kubernetes contexts)."""
        return tuple(self.geography.regions) if self.geography is not None else ()


_LOCK = threading.Lock()
_SPECS: dict[str, CloudSpec] = {}


def _load() -> dict[str, CloudSpec]:
    """The specs, loaded once (all or none: a spec module that fails to import fails every
    call). Spec modules must not call the registry while they are imported."""
    with _LOCK:
        if not _SPECS:
            loaded: dict[str, CloudSpec] = {}
            for module in SPEC_MODULES:
                _add(loaded, importlib.import_module(module).SPEC)
            _SPECS.update(loaded)
        return _SPECS


def _add(loaded: dict[str, CloudSpec], spec: CloudSpec) -> None:
    if not _NAME.fullmatch(spec.name):
        raise ValueError(f"cloud name {spec.name!r}: 2-16 lowercase letters and digits")
    if spec.name in loaded or spec.name in (LOCAL, INTERNET):
        raise ValueError(f"cloud {spec.name!r} registered twice")
    if spec.geography is not None:
        if spec.geography.name != spec.name:
            raise ValueError(f"cloud {spec.name!r}: its geography is {spec.geography.name!r}")
        catalog.register_cloud(spec.geography)
    catalog.register_egress(spec.name, spec.egress)
    if spec.instance_types is not None:
        catalog.register_instance_types(spec.name, spec.instance_types)
    loaded[spec.name] = spec


def names() -> tuple[str, ...]:
    """Every registered cloud, in registry order."""
    return tuple(_load())


def specs() -> tuple[CloudSpec, ...]:
    return tuple(_load().values())


def spec(name: str) -> CloudSpec:
    try:
        return _load()[name]
    except KeyError:
        raise UnknownNameError("cloud", name, list(_load())) from None


def of_notice_source(source: str) -> CloudSpec | None:
    """The cloud whose preemption-notice reader is `source`, if any."""
    return next((s for s in specs() if s.notice_source == source), None)
