"""The cloud world: the registered clouds' providers (providers/registry.py: AWS, GCP, Azure,
Kubernetes) behind one `MultiProvider`, per-region checkpoint stores, and the checks and
tables the CLI prints.

Cloud settings are the `clouds:` section of `$HELIOTROPE_HOME/config.yaml`, or a YAML file
of their own (`clouds_file:`, `heliotrope providers check --config`, default
`$HELIOTROPE_HOME/clouds.yaml`); every field is described in docs/providers.md:

    cluster: ml-prod
    providers: [aws, gcp]
    aws:
      regions: [us-east-1, us-west-2]
    gcp:
      project: my-gpu-project
      zones: [us-central1-a, europe-west4-a]
      billing_api_key_env: HELIOTROPE_GCP_BILLING_KEY   # the variable's name, never the key
    checkpoints:
      aws:us-east-1: s3://heliotrope-ml-prod-use1/ckpt
      default: gs://heliotrope-ml-prod-{region}/ckpt     # {cloud} {region} {cluster}

Each registered cloud has a section of its own name, validated by its spec's settings model;
nothing here knows a cloud by name. Credentials are never part of the file: each adapter
uses its cloud's standard chain (boto3's, Application Default Credentials,
DefaultAzureCredential, the kubeconfig), or what the caller passes in `CloudAccess`.

`clouds_world` is the live world of these clouds: their offers, the quotes read when it is
built as the price prior only; what the policy decides on each tick is what the signals
poller stored (`orchestrator.signals.view.StoreSignalView`). Live jobs on clouds run code
the controller cannot see, so progress is modelled from throughput
(`LoopOptions.progress_from_provider=False`).
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from orchestrator import catalog
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError, InputError
from orchestrator.live.world import LiveSettings, World, home
from orchestrator.model import Market, Offer, OfferId, SignalKind
from orchestrator.signals.grid import WORLD_AVG_G_PER_KWH
from orchestrator.signals.traces import DEFAULT_MAX_AGE_S, Trace, read_trace
from orchestrator.state import StateStore
from orchestrator.yamlio import load_yaml
from providers import registry
from providers.base import ComputeProvider, Quote
from providers.multi import MultiProvider
from providers.registry import BuildContext, CloudAccess

__all__ = [
    "CloudAccess",
    "CloudSettings",
    "check_providers",
    "clouds_world",
    "load_cloud_settings",
    "make_providers",
    "offers_table",
    "parse_clouds",
]

logger = logging.getLogger(__name__)

HOURLY: Final = "carbon_avg_g_per_kwh"
YEARLY: Final = "carbon_avg_yearly_g_per_kwh"
CARBON_LOOKBACK_S: Final = 7 * 86400.0  # how far back the state store is asked for samples
_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


# -- settings ---------------------------------------------------------------------------------


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
    try:
        settings = CloudSettings.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(file)"
        raise InputError(
            str(path),
            where,
            "valid cloud settings (docs/providers.md)",
            got=first.get("msg", str(exc)),
        ) from exc
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


# -- providers --------------------------------------------------------------------------------


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
            settings.section(name), _context(settings, name, clock, access)
        )
        for name in clouds or settings.providers
    }


def _context(settings: CloudSettings, name: str, clock: Clock, access: CloudAccess) -> BuildContext:
    return BuildContext(
        cluster=settings.cluster, clock=clock, access=access.of(name), sleep=access.sleep
    )


# -- carbon ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CarbonReading:
    g_per_kwh: float
    source: str  # says which: an hourly sample (when, from where), a yearly average, a default
    hourly: bool


@dataclass
class CarbonIndex:
    """Grid carbon intensity per grid zone: hourly samples (a trace's `grid.parquet`, the
    state store's `carbon` samples keyed by grid zone) and yearly averages (the trace's,
    else the built-in scenario's Electricity Maps 2024 figures), else the world average.

    `at(zone, now)` is the latest hourly value at or before `now` when there is one, else the
    yearly average, and says which. The controller's grid applies the trace's maximum ages
    (an hourly value older than 2 h no longer counts there)."""

    hourly: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)
    yearly: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    extra_rows: pd.DataFrame | None = None  # other grid metrics of a trace, passed through
    max_age_s: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MAX_AGE_S))

    @staticmethod
    def build(
        zones: Iterable[str],
        *,
        trace: Trace | None = None,
        store: StateStore | None = None,
        now_s: float | None = None,
    ) -> CarbonIndex:
        from orchestrator.signals.scenario import GRID_ZONES

        zones = sorted(set(zones))
        index = CarbonIndex()
        if trace is not None:
            index.max_age_s = {
                **index.max_age_s,
                **{m: trace.max_age_s(m) for m in DEFAULT_MAX_AGE_S},
            }
            rows = trace.grid[trace.grid["grid_zone"].isin(zones)]
            for metric, target in ((HOURLY, index.hourly), (YEARLY, None)):
                sel = rows[rows["metric"] == metric]
                for z, t, v, s in zip(
                    sel["grid_zone"], sel["time"], sel["value"], sel["source"], strict=True
                ):
                    if not math.isfinite(float(v)):
                        continue
                    item = (pd.Timestamp(t).timestamp(), float(v), f"trace {s}".strip())
                    if target is not None:
                        target.setdefault(str(z), []).append(item)
                    elif str(z) not in index.yearly or item[0] >= index.yearly[str(z)][0]:
                        index.yearly[str(z)] = item
            index.extra_rows = rows[~rows["metric"].isin([HOURLY, YEARLY])]
        if store is not None and now_s is not None:
            for sample in store.samples(
                SignalKind.CARBON, zones, now_s - CARBON_LOOKBACK_S, now_s + 1.0
            ):
                if math.isfinite(sample.value):
                    index.hourly.setdefault(sample.key, []).append(
                        (sample.time.timestamp(), float(sample.value), f"store {sample.source}")
                    )
        for series in index.hourly.values():
            series.sort(key=lambda x: x[0])
        for z in zones:
            if z not in index.yearly and z in GRID_ZONES:
                index.yearly[z] = (
                    float("nan"),
                    float(GRID_ZONES[z].yearly_g),
                    "scenario, Electricity Maps 2024",
                )
        return index

    def at(self, zone: str, now_s: float) -> CarbonReading:
        series = [x for x in self.hourly.get(zone, ()) if x[0] <= now_s]
        if series:
            t, value, source = series[-1]
            when = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%MZ")
            return CarbonReading(value, f"hourly {when} ({source})", True)
        if zone in self.yearly:
            t, value, source = self.yearly[zone]
            year = f" {datetime.fromtimestamp(t, UTC).year}" if math.isfinite(t) else ""
            return CarbonReading(value, f"yearly average{year} ({source})", False)
        return CarbonReading(WORLD_AVG_G_PER_KWH, "world average (no data for the zone)", False)


def carbon_sources(
    settings: CloudSettings, traces: Path | None
) -> tuple[Trace | None, StateStore | None]:
    """The trace (`--traces`, else the settings') and the state store (`db_url`, else
    $HELIOTROPE_DB_URL; no store is created just to read carbon) to read carbon from."""
    path = traces or settings.traces
    trace = read_trace(path) if path is not None else None
    url = settings.db_url or os.environ.get("HELIOTROPE_DB_URL")
    store: StateStore | None = None
    if url:
        from orchestrator.state import open_store

        store = open_store(url)
    return trace, store


# -- the world ------------------------------------------------------------------------------------


def clouds_world(
    live: LiveSettings,
    settings: CloudSettings,
    *,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> World:
    """The configured clouds as a live world: their offers (those in a region with a
    checkpoint store and a quoted price), on the wall clock, deciding on the state store's
    polled signals with the quotes as the price prior. Progress is modelled from throughput
    (the controller cannot see inside a cloud job)."""
    from orchestrator.live.world import World
    from orchestrator.signals.view import list_priors

    clock = clock or SystemClock()
    providers = make_providers(settings, clock=clock, access=access)
    multi = MultiProvider(list(providers.values()))
    offers = multi.offers()
    quotes = multi.quotes()
    no_store = sorted(
        {f"{o.cloud}:{o.region}" for o in offers if settings.store_uri(o.cloud, o.region) is None}
    )
    if no_store:
        logger.warning(
            "no checkpoint store for %s: their offers are left out (add them to `checkpoints:`)",
            ", ".join(no_store),
        )
    usable = tuple(
        o for o in offers if settings.store_uri(o.cloud, o.region) is not None and o.id in quotes
    )
    if not usable:
        raise InputError(
            "clouds settings",
            "providers",
            "at least one offer with a price and a checkpoint store",
            got="none",
            fix="run `heliotrope providers check` and fill `checkpoints:`",
        )
    priors = list_priors(usable, live.spot_capacity, {k: q.usd_per_hour for k, q in quotes.items()})

    def store_uri(offer: Offer) -> str:
        uri = settings.store_uri(offer.cloud, offer.region)
        if uri is None:  # only offers with a store are in the world: a bug if it happens
            raise InputError(
                "clouds settings",
                "checkpoints",
                f"a store for {offer.cloud}:{offer.region}",
                got="none",
            )
        return uri

    return World(
        live,
        multi,
        usable,
        clock,
        priors,
        store_uri=store_uri,
        progress_from_provider=False,
        entrypoint=tuple(settings.entrypoint),
        extra={"cluster": settings.cluster, "quotes": quotes},
    )


# -- `heliotrope offers` ----------------------------------------------------------------------


def gpu_matches(gpu_type: str, wanted: str) -> bool:
    """`--gpu A100` matches A100-40GB and A100-80GB; `--gpu A100-80GB` only that one."""
    w = wanted.strip().upper()
    g = gpu_type.upper()
    return g == w or g.split("-", 1)[0] == w or catalog.canonical_gpu_name(wanted) == gpu_type


def offer_rows(
    offers: Iterable[Offer],
    quotes: Mapping[OfferId, Quote],
    carbon: CarbonIndex,
    now_s: float,
    *,
    gpu: str | None = None,
    market: Market | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Priced offers as table rows, cheapest per GPU-hour first; and how many matching
    offers have no known price (left out)."""
    rows: list[tuple[float, str, dict[str, Any]]] = []
    unpriced = 0
    for o in offers:
        if gpu and not gpu_matches(o.gpu_type, gpu):
            continue
        if market is not None and o.market is not market:
            continue
        quote = quotes.get(o.id)
        if quote is None:
            unpriced += 1
            continue
        per_gpu = quote.usd_per_hour / max(o.gpu_count, 1)
        reading = carbon.at(o.grid_zone, now_s)
        rows.append(
            (
                per_gpu,
                o.id,
                {
                    "cloud": o.cloud,
                    "region": o.region,
                    "zone": o.zone,
                    "instance_type": o.instance_type,
                    "gpu": o.gpu_type,
                    "gpus": o.gpu_count,
                    "market": o.market.value,
                    "usd_per_gpu_hour": round(per_gpu, 4),
                    "usd_per_hour": round(quote.usd_per_hour, 4),
                    "price_source": quote.source,
                    "grid_zone": o.grid_zone,
                    "g_co2_per_kwh": round(reading.g_per_kwh, 1),
                    "carbon_source": reading.source,
                },
            )
        )
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in rows], unpriced


def compact_offer_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """`offer_rows` for a terminal: fewer, narrower columns."""
    return [
        {
            "where": f"{r['cloud']}:{r['zone']}",
            "instance": r["instance_type"],
            "gpus": f"{r['gpus']} x {r['gpu']}",
            "market": r["market"],
            "$/GPU-h": f"{r['usd_per_gpu_hour']:.3f}",
            "$/h": f"{r['usd_per_hour']:.3f}",
            "price from": r["price_source"],
            "gCO2/kWh": f"{r['g_co2_per_kwh']:.0f} {r['grid_zone']}",
            "carbon from": r["carbon_source"],
        }
        for r in rows
    ]


def parse_market(text: str | None) -> Market | None:
    if not text:
        return None
    try:
        return Market(text.strip().lower().replace("-", "_"))
    except ValueError:
        raise InputError("", "--market", "spot or on_demand", got=repr(text)) from None


def offers_table(
    settings: CloudSettings,
    *,
    clouds: Sequence[str] | None = None,
    gpu: str | None = None,
    market: Market | None = None,
    traces: Path | None = None,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> tuple[list[dict[str, Any]], int]:
    if (
        gpu
        and catalog.canonical_gpu_name(gpu) is None
        and not any(g.split("-", 1)[0] == gpu.strip().upper() for g in catalog.GPUS)
    ):
        raise InputError(
            "", "--gpu", "a GPU type: " + ", ".join(sorted(catalog.GPUS)), got=repr(gpu)
        )
    clock = clock or SystemClock()
    providers = make_providers(settings, clock=clock, access=access, clouds=clouds)
    multi = MultiProvider(list(providers.values()))
    offers = multi.offers()
    quotes = multi.quotes()
    trace, store = carbon_sources(settings, traces)
    now_s = clock.now().timestamp()
    carbon = CarbonIndex.build({o.grid_zone for o in offers}, trace=trace, store=store, now_s=now_s)
    return offer_rows(offers, quotes, carbon, now_s, gpu=gpu, market=market)


# -- `heliotrope providers check` ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    provider: str
    check: str
    result: Literal["ok", "fail", "skip"]
    reason: str

    def row(self) -> dict[str, str]:
        return {
            "provider": self.provider,
            "check": self.check,
            "result": self.result,
            "reason": self.reason,
        }


class _Redactor:
    """Removes secrets (credential values from the environment, keys the settings point
    at, anything shaped like a cloud's credential) from what a check prints."""

    def __init__(
        self, secrets: Iterable[str | None], patterns: Iterable[re.Pattern[str]] = ()
    ) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self._patterns = tuple(patterns)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        text = " ".join(text.split())
        for pattern in self._patterns:
            text = pattern.sub("***", text)
        return text[:400]


def check_providers(
    settings: CloudSettings,
    *,
    clouds: Sequence[str] | None = None,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> list[CheckResult]:
    """Credentials and permissions of each configured cloud, one row per check (its
    registry spec's `check`). A cloud whose settings or SDK are missing gets one failed
    `settings` row; the others are checked all the same."""
    clock = clock or SystemClock()
    access = access or CloudAccess()
    names = list(clouds or settings.providers)
    secrets: list[str | None] = []
    for spec in registry.specs():
        secrets += [os.environ.get(n) for n in spec.secret_env]
        if spec.name in settings.providers:
            secrets += spec.secrets(settings.section(spec.name))
    redact = _Redactor(secrets, [p for s in registry.specs() for p in s.secret_patterns])
    results: list[CheckResult] = []
    for name in names:
        spec = registry.spec(name)
        section = settings.section(name)
        ctx = _context(settings, name, clock, access)
        try:
            rows = spec.check(spec.build(section, ctx), section, ctx)
        except HeliotropeError as exc:
            rows = [("settings", "fail", str(exc))]
        except ImportError as exc:
            rows = [
                (
                    "settings",
                    "fail",
                    f"the {spec.title} SDK is not installed ({exc.name}): "
                    f"pip install -e '.[{name}]'",
                )
            ]
        results += [
            CheckResult(name, check, result, redact(reason)) for check, result, reason in rows
        ]
    return results
