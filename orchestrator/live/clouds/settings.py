"""The clouds settings: the `clouds:` section of `$HELIOTROPE_HOME/config.yaml`, or a YAML
file of their own (`clouds_file:`, `heliotrope providers check --config`, default
`$HELIOTROPE_HOME/clouds.yaml`); every field is described in docs/providers.md.

Each registered cloud (providers/registry.py) has a section of its own name, validated by
its spec's `settings_model`: `CloudSettings` is built from the registry, so nothing here
knows a cloud by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from orchestrator.errors import InputError
from orchestrator.live.world import home
from orchestrator.yamlio import load_yaml, validated
from providers import registry

_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class _CloudSettings(BaseModel):
    """The clouds settings; `CloudSettings` adds one optional section per registered cloud
    (`section(name)` reads it)."""

    model_config = ConfigDict(extra="forbid")

    cluster: str
    providers: list[str] = Field(min_length=1)
    # "<cloud>:<region>" -> store URI; "default": a template with {cloud} {region} {cluster}.
    checkpoints: dict[str, str] = Field(default_factory=dict)
    policy: str = "heliotrope"
    tick_s: int = Field(default=600, gt=0)
    days: float = Field(default=7.0, gt=0, le=60)
    interval_s: float = Field(default=600.0, gt=0)
    spot_capacity: float = Field(default=4.0, ge=0)  # instances assumed obtainable per spot offer
    db_url: str | None = None
    traces: Path | None = None  # a trace directory with hourly carbon (relative: to the file)
    entrypoint: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> _CloudSettings:
        if not _CLUSTER.fullmatch(self.cluster):
            raise ValueError(f"cluster {self.cluster!r}: 1-63 letters, digits, '.', '_' or '-'")
        known = registry.names()
        unknown = [p for p in self.providers if p not in known]
        if unknown:
            raise ValueError(
                f"providers: {', '.join(map(repr, unknown))} is not a registered "
                f"cloud (known: {', '.join(known)})"
            )
        if len(set(self.providers)) != len(self.providers):
            raise ValueError("providers: list each cloud once")
        for name in self.providers:
            if getattr(self, name, None) is None:
                raise ValueError(f"providers lists {name} but there is no `{name}:` section")
        for key, uri in self.checkpoints.items():
            cloud, sep, region = key.partition(":")
            if key != "default" and not (sep and cloud in known and region):
                raise ValueError(
                    f"checkpoints: key {key!r} is not `default` or `<cloud>:<region>` "
                    f"(clouds: {', '.join(known)})"
                )
            try:
                uri.format(cloud="c", region="r", cluster="c")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"checkpoints[{key}]: {uri!r} may use only {{cloud}}, "
                    f"{{region}} and {{cluster}} ({exc})"
                ) from None
        return self

    def section(self, cloud: str) -> BaseModel:
        """The settings section of a configured cloud (its spec's settings model)."""
        value = getattr(self, cloud, None)
        if not isinstance(value, BaseModel):
            raise InputError("clouds settings", cloud, f"a `{cloud}:` section", got="none")
        return value

    def store_uri(self, cloud: str, region: str) -> str | None:
        """The checkpoint store of a region, or None when the settings name none."""
        uri = self.checkpoints.get(f"{cloud}:{region}") or self.checkpoints.get("default")
        if uri is None:
            return None
        return uri.format(cloud=cloud, region=region, cluster=self.cluster)


_CLASH = [
    s.name
    for s in registry.specs()
    if hasattr(_CloudSettings, s.name) or s.name in _CloudSettings.model_fields
]
if _CLASH:  # a cloud named like a setting (`policy`, `days`, ...) could not have a section
    raise RuntimeError(f"registered cloud(s) {', '.join(_CLASH)} clash with clouds settings")

if TYPE_CHECKING:
    CloudSettings = _CloudSettings
else:
    CloudSettings = create_model(
        "CloudSettings",
        __base__=_CloudSettings,
        __module__=__name__,
        **{s.name: (s.settings_model | None, None) for s in registry.specs()},
    )


def settings_path(path: Path | None = None) -> Path:
    return path or home() / "clouds.yaml"


def load_cloud_settings(path: Path | None = None) -> CloudSettings:
    path = settings_path(path)
    if not path.is_file():
        raise InputError(
            str(path),
            "",
            "a clouds settings file",
            got="missing",
            fix="write one (docs/providers.md, 'Several clouds at once') or pass --config",
        )
    raw = (
        load_yaml(
            path, what="a clouds settings file", fix="see docs/providers.md", max_bytes=1 << 20
        )
        or {}
    )
    settings = validated(
        CloudSettings, raw, source=str(path), expected="valid cloud settings (docs/providers.md)"
    )
    if settings.traces is not None and not settings.traces.is_absolute():
        settings = settings.model_copy(update={"traces": path.parent / settings.traces})
    return settings


def parse_clouds(text: str | None, settings: CloudSettings) -> list[str]:
    """`--cloud aws,gcp` as a list of configured clouds (None or "": all of them)."""
    if not text:
        return list(settings.providers)
    wanted = [c.strip().lower() for c in text.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in settings.providers]
    if unknown or not wanted:
        raise InputError(
            "",
            "--cloud",
            "configured clouds: " + ", ".join(settings.providers),
            got=", ".join(unknown) or repr(text),
        )
    return list(dict.fromkeys(wanted))
