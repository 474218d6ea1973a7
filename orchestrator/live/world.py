"""The configured world: which providers, offers, signal view, clock and carbon price a live
entry point runs. Every live command and DAG asks `configured_world()`; none builds its own.

`$HELIOTROPE_HOME/config.yaml` (every field optional; docs/deploy.md):

    world: local                 # local (this machine's provider) | clouds (clouds: below)
    db_url: sqlite:////home/me/.heliotrope/heliotrope.db   # else $HELIOTROPE_DB_URL
    policy: heliotrope
    carbon_usd_per_tonne: 200    # the carbon price the policy weighs (0: cost only)
    tick_s: 600                  # spacing of the signal history rows
    interval_s: 600              # seconds between ticks of `controller run`
    signals: polled              # polled: the state store's samples, on the wall clock
                                 # scenario: the built-in scenario at `speed`x (demo, tests)
    max_age: {price_s: 21600, capacity_s: 7200, carbon_s: 7200, curtailment_s: 7200}
    capacity_backoff_s: 1800     # a refused spot launch: no capacity there for this long
    spot_capacity: 4             # prior: spot instances assumed obtainable per offer
    capacity: 4                  # local world: instances per local region
    emulate_startup: false       # local world: an instance is ready after the start-up the
                                 # job declares (cold start, transfer), as a cloud one boots
    cluster: heliotrope-local
    seed: 0                      # scenario only: seed, start, days, speed
    start: 2024-04-02T06:00:00Z
    days: 7
    speed: 600
    events: [{kind: carbon, region: us-central1, at_h: 4, hours: 6, g_per_kwh: 850}]
                                 # scenario only: scripted signal events (signals/events.py)
    clouds: {providers: [aws, gcp], aws: {...}, gcp: {...}, checkpoints: {...}}
                                 # world: clouds (or clouds_file: clouds.yaml, the default)

The local world: four "regions" (directories under `$HELIOTROPE_HOME/local`) take the
names and single-GPU instance types (L4) of four cloud regions on two continents, so the
polled signals of those regions (prices, spot placement, grid carbon) are what it decides
on, and the same policy that replays a trace decides where the local jobs run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import units
from orchestrator.clock import Clock, ScaledClock, SystemClock
from orchestrator.errors import InputError
from orchestrator.loop import LoopOptions
from orchestrator.model import CostSettings, Offer
from orchestrator.signals.events import GridEvent, apply_events
from orchestrator.signals.grid import SignalGrid
from orchestrator.signals.view import (
    DEFAULT_LOOKBACK_S,
    GridView,
    MaxAges,
    Priors,
    SignalView,
    StoreSignalView,
    list_priors,
)
from orchestrator.state import MemoryStateStore, StateStore, open_store
from orchestrator.yamlio import load_yaml, validated
from providers.base import ComputeProvider
from providers.local import LocalProvider

if TYPE_CHECKING:
    from orchestrator.live.clouds.settings import CloudSettings
    from providers.registry import CloudAccess

# (region, instance type): L4 machines in four regions on two clouds.
LOCAL_REGIONS: tuple[tuple[str, str], ...] = (
    ("us-east-1", "g6.xlarge"),
    ("eu-north-1", "g6.xlarge"),
    ("us-central1", "g2-standard-4"),
    ("europe-west4", "g2-standard-4"),
)
CONFIG_FILE = "config.yaml"
CLOCK_FILE = "clock.json"  # when scenario time began for this home (signals: scenario)
MAX_CONFIG_BYTES = 1 << 20


class MaxAgeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price_s: float = Field(default=6 * 3600.0, gt=0, allow_inf_nan=False)
    capacity_s: float = Field(default=2 * 3600.0, gt=0, allow_inf_nan=False)
    carbon_s: float = Field(default=2 * 3600.0, gt=0, allow_inf_nan=False)
    curtailment_s: float = Field(default=2 * 3600.0, gt=0, allow_inf_nan=False)

    def ages(self) -> MaxAges:
        return MaxAges(self.price_s, self.capacity_s, self.carbon_s, self.curtailment_s)


class LiveSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    world: Literal["local", "clouds"] = "local"
    db_url: str | None = None
    policy: str = "heliotrope"
    carbon_usd_per_tonne: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    tick_s: int = Field(default=600, gt=0)
    interval_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    signals: Literal["polled", "scenario"] = "polled"
    max_age: MaxAgeSettings = Field(default_factory=MaxAgeSettings)
    capacity_backoff_s: float = Field(default=1800.0, ge=0, allow_inf_nan=False)
    spot_capacity: float = Field(default=4.0, ge=0, allow_inf_nan=False)
    lookback_h: float = Field(
        default=units.hours(DEFAULT_LOOKBACK_S), gt=0, le=24 * 60, allow_inf_nan=False
    )
    capacity: int = Field(default=4, ge=1)
    emulate_startup: bool = False
    cluster: str = Field(default="heliotrope-local", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    seed: int = 0
    start: datetime = datetime(2024, 4, 2, 6, tzinfo=UTC)
    days: float = Field(default=7.0, gt=0, le=60)
    speed: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    events: list[GridEvent] = Field(default_factory=list, max_length=100)
    clouds: dict[str, Any] | None = None
    clouds_file: Path | None = None

    @property
    def scenario(self) -> bool:
        return self.signals == "scenario"

    @model_validator(mode="after")
    def _events_need_a_scenario(self) -> LiveSettings:
        if self.events and not self.scenario:
            raise ValueError(
                "events: script the built-in scenario; set signals: scenario or drop events:"
            )
        return self


def home() -> Path:
    """`$HELIOTROPE_HOME` (default ~/.heliotrope); it must be a directory, or not exist."""
    path = Path(os.environ.get("HELIOTROPE_HOME", "~/.heliotrope")).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(
            "$HELIOTROPE_HOME",
            "",
            "a directory (or a path that does not exist)",
            got=f"{path} is a file",
            fix="point HELIOTROPE_HOME at a directory",
        )
    return path


def load_settings(path: Path | None = None) -> LiveSettings:
    path = path or home() / CONFIG_FILE
    if not path.exists() and not path.is_symlink():
        return LiveSettings()
    raw = (
        load_yaml(
            path, what="live settings (YAML)", fix="see docs/deploy.md", max_bytes=MAX_CONFIG_BYTES
        )
        or {}
    )
    if not isinstance(raw, dict):
        raise InputError(
            str(path), "", "a mapping of settings (docs/deploy.md)", got=type(raw).__name__
        )
    settings = validated(
        LiveSettings, raw, source=str(path), expected="valid live settings (docs/deploy.md)"
    )
    if settings.clouds_file is not None and not settings.clouds_file.is_absolute():
        settings = settings.model_copy(update={"clouds_file": path.parent / settings.clouds_file})
    return settings


@dataclass(frozen=True)
class World:
    """What a live entry point runs: the provider, its offers, the signals, the clock."""

    settings: LiveSettings
    provider: ComputeProvider
    offers: tuple[Offer, ...]
    clock: Clock
    priors: Priors
    store_uri: Callable[[Offer], str]
    grid: SignalGrid | None = None  # the scenario's, when signals: scenario
    progress_from_provider: bool = True
    entrypoint: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cluster(self) -> str:
        return str(self.extra.get("cluster", self.settings.cluster))

    def db_url(self) -> str:
        return db_url(self.settings)

    def open_store(self) -> StateStore:
        return open_store(self.db_url())

    def view(self, store: StateStore) -> SignalView:
        """The policy's signals: the scenario's grid, or the store's polled samples."""
        if self.grid is not None:
            return GridView(self.grid)
        return StoreSignalView(
            store,
            self.offers,
            tick_s=self.settings.tick_s,
            priors=self.priors,
            max_ages=self.settings.max_age.ages(),
            lookback_s=units.seconds(self.settings.lookback_h),
        )

    def options(self) -> LoopOptions:
        return LoopOptions(
            cluster=self.cluster,
            settings=CostSettings(carbon_usd_per_tonne=self.settings.carbon_usd_per_tonne),
            progress_from_provider=self.progress_from_provider,
            entrypoint=self.entrypoint,
            reconcile=True,
        )

    @property
    def local(self) -> LocalProvider | None:
        """The local provider, when this world runs on this machine."""
        return self.provider if isinstance(self.provider, LocalProvider) else None


def db_url(settings: LiveSettings) -> str:
    """The state store's URL: the settings', else $HELIOTROPE_DB_URL, else the home's
    SQLite file."""
    return (
        settings.db_url
        or os.environ.get("HELIOTROPE_DB_URL")
        or f"sqlite:///{home() / 'heliotrope.db'}"
    )


def open_configured_store(*, create: bool = True) -> StateStore:
    """The configured state store, without building the world. With `create` off (the
    commands that only read) a SQLite file that is not there yet is not made: they read an
    empty fleet (nothing was submitted) and leave no file or folder behind."""
    url = db_url(load_settings())
    if not create:
        from orchestrator.state.sql import resolve_url

        u = resolve_url(url)
        path = u.database if u.get_backend_name() == "sqlite" else None
        if (
            path
            and path != ":memory:"
            and not path.startswith("file:")
            and not Path(path).is_file()
        ):
            return MemoryStateStore()
    return open_store(url)


def configured_world(
    settings: LiveSettings | None = None,
    *,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> World:
    """The world `$HELIOTROPE_HOME/config.yaml` names."""
    settings = settings or load_settings()
    if settings.world == "clouds":
        from orchestrator.live.clouds.world import clouds_world

        return clouds_world(settings, cloud_settings(settings), clock=clock, access=access)
    return local_world(settings, clock=clock)


def cloud_settings(settings: LiveSettings) -> CloudSettings:
    from orchestrator.live.clouds.settings import CloudSettings, load_cloud_settings

    if settings.clouds is not None:
        return validated(
            CloudSettings,
            {"cluster": settings.cluster, **settings.clouds},
            source=str(home() / CONFIG_FILE),
            expected="valid cloud settings (docs/providers.md)",
            at="clouds",
        )
    return load_cloud_settings(settings.clouds_file)


def local_world(settings: LiveSettings | None = None, *, clock: Clock | None = None) -> World:
    settings = settings or load_settings()
    grid = _scenario_grid(settings) if settings.scenario else None
    offers = grid.offers if grid is not None else local_offers()
    if clock is None:
        clock = (
            ScaledClock(SystemClock(), settings.start, settings.speed, real_origin=_real_origin())
            if settings.scenario
            else SystemClock()
        )
    regions = sorted({o.region for o in offers})
    provider = LocalProvider(
        home() / "local",
        cluster=settings.cluster,
        offers=offers,
        capacity={r: settings.capacity for r in regions},
        clock=clock,
        grace_s=15.0,
        emulate_startup=settings.emulate_startup,
    )
    priors = list_priors(
        offers, settings.spot_capacity if not settings.scenario else float(settings.capacity)
    )
    return World(
        settings,
        provider,
        tuple(offers),
        clock,
        priors,
        store_uri=lambda o: provider.checkpoint_uri(o.region),
        grid=grid,
    )


def local_offers() -> tuple[Offer, ...]:
    """The local world's offers (the scenario's, for the four regions, without its signals)."""
    from orchestrator.signals.scenario import generate

    trace = generate(0, 1.0)
    wanted = set(LOCAL_REGIONS)
    start = datetime(2024, 4, 1, tzinfo=UTC)
    grid = SignalGrid.build(
        trace,
        start,
        datetime(2024, 4, 1, 1, tzinfo=UTC),
        3600,
        keep_offer=lambda o: (o.region, o.instance_type) in wanted,
    )
    return grid.offers


def _scenario_grid(settings: LiveSettings) -> SignalGrid:
    from orchestrator.signals.scenario import generate
    from providers.sim import realize_spot

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
    return apply_events(realize_spot(grid, settings.seed), settings.events)


def restart_scenario_clock(world: World) -> None:
    """Scenario time starts at `start` again, now (the demo: after its set-up, so the first
    tick is the scenario's first); every command of the home agrees (clock.json)."""
    if not isinstance(world.clock, ScaledClock):
        raise InputError("config.yaml", "signals", "scenario", got=world.settings.signals)
    world.clock.restart()
    _write_origin(world.clock.real_origin)


def _real_origin() -> datetime:
    """When scenario time began for this home: fixed on first use, so every command of the
    same home agrees on what time it is in the scenario."""
    known = read_origin()
    if known is not None:
        return known
    now = SystemClock().now()
    _write_origin(now)
    return now


def read_origin() -> datetime | None:
    """When scenario time began for this home, if it has begun (nothing is written)."""
    path = home() / CLOCK_FILE
    if not path.is_file():
        return None
    return datetime.fromisoformat(json.loads(path.read_text())["real_origin"])


def _write_origin(real_origin: datetime) -> None:
    path = home() / CLOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"real_origin": real_origin.isoformat()}))


def _day(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
