"""The live world on this machine: the local provider priced by the built-in scenario.

Four "regions" (directories under `$HELIOTROPE_HOME/local`) take the names, prices, spot
capacity and grid carbon of four scenario regions on two clouds and two continents, one
single-GPU instance type each (L4), so the same policy that replays the scenario decides
where the local jobs run. Scenario time runs `speed` times faster than the wall clock.

Settings come from `$HELIOTROPE_HOME/config.yaml` when it exists (every field optional):

    db_url: sqlite:////home/me/.heliotrope/heliotrope.db
    seed: 0
    start: 2024-04-02T06:00:00Z
    days: 7
    speed: 600
    policy: heliotrope
    interval_s: 600          # scenario seconds between ticks
    capacity: 4              # instances per local region
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.clock import Clock, ScaledClock, SystemClock
from orchestrator.errors import InputError
from orchestrator.model import Offer
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.scenario import generate
from orchestrator.state import StateStore, open_store
from providers.local import LocalProvider
from providers.sim import realize_spot

# (region, instance type): L4 machines in four scenario regions.
LOCAL_REGIONS: tuple[tuple[str, str], ...] = (
    ("us-east-1", "g6.xlarge"),
    ("eu-north-1", "g6.xlarge"),
    ("us-central1", "g2-standard-4"),
    ("europe-west4", "g2-standard-4"),
)


class LiveSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db_url: str | None = None
    seed: int = 0
    start: datetime = datetime(2024, 4, 2, 6, tzinfo=UTC)
    days: float = Field(default=7.0, gt=0, le=60)
    speed: float = Field(default=600.0, gt=0)
    policy: str = "heliotrope"
    interval_s: float = Field(default=600.0, gt=0)
    capacity: int = Field(default=4, ge=1)
    cluster: str = "heliotrope-local"


def home() -> Path:
    return Path(os.environ.get("HELIOTROPE_HOME", "~/.heliotrope")).expanduser()


def load_settings(path: Path | None = None) -> LiveSettings:
    path = path or home() / "config.yaml"
    if not path.is_file():
        return LiveSettings()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        return LiveSettings.model_validate(raw)
    except (yaml.YAMLError, ValidationError) as exc:
        raise InputError(
            str(path),
            "",
            "valid live settings (see orchestrator/live/world.py)",
            got=str(exc).splitlines()[0],
        ) from exc


@dataclass(frozen=True)
class LocalWorld:
    settings: LiveSettings
    grid: SignalGrid
    provider: LocalProvider
    clock: Clock

    def store_uri(self, offer: Offer) -> str:
        return self.provider.checkpoint_uri(offer.region)

    def db_url(self) -> str:
        return (
            self.settings.db_url
            or os.environ.get("HELIOTROPE_DB_URL")
            or f"sqlite:///{home() / 'heliotrope.db'}"
        )

    def open_store(self) -> StateStore:
        url = self.db_url()
        return open_store(url)


def local_world(settings: LiveSettings | None = None, *, clock: Clock | None = None) -> LocalWorld:
    settings = settings or load_settings()
    trace = generate(settings.seed, settings.days + 1.0, start=_day(settings.start))
    wanted = set(LOCAL_REGIONS)
    end = settings.start.timestamp() + settings.days * 86400.0
    grid = SignalGrid.build(
        trace,
        settings.start,
        datetime.fromtimestamp(end, tz=UTC),
        600,
        keep_offer=lambda o: (o.region, o.instance_type) in wanted,
    )
    grid = realize_spot(grid, settings.seed)
    clock = clock or ScaledClock(
        SystemClock(), settings.start, settings.speed, real_origin=_real_origin()
    )
    regions = sorted({o.region for o in grid.offers})
    provider = LocalProvider(
        home() / "local",
        cluster=settings.cluster,
        offers=grid.offers,
        capacity={r: settings.capacity for r in regions},
        clock=clock,
        grace_s=15.0,
    )
    return LocalWorld(settings, grid, provider, clock)


def _real_origin() -> datetime:
    """When scenario time began for this home: fixed on first use, so every command of the
    same home agrees on what time it is in the scenario."""
    path = home() / "clock.json"
    if path.is_file():
        return datetime.fromisoformat(json.loads(path.read_text())["real_origin"])
    now = SystemClock().now()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"real_origin": now.isoformat()}))
    return now


def _day(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
