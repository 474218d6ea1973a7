"""The cloud world: real providers (AWS, GCP) behind one `MultiProvider`, per-region
checkpoint stores, and the checks and tables the CLI prints.

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

Credentials are never part of the file: each adapter uses its cloud's standard chain
(boto3's, Application Default Credentials), or what the caller passes in `CloudAccess`.

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
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator import catalog
from orchestrator.clock import Clock, SystemClock
from orchestrator.errors import HeliotropeError, InputError
from orchestrator.live.world import LiveSettings, World, home
from orchestrator.model import Market, Offer, OfferId, SignalKind
from orchestrator.signals.grid import WORLD_AVG_G_PER_KWH
from orchestrator.signals.traces import DEFAULT_MAX_AGE_S, Trace, read_trace
from orchestrator.state import StateStore
from providers.base import ComputeProvider
from providers.multi import MultiProvider, Quote

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from providers.aws import AwsProvider
    from providers.aws._session import SessionFactory
    from providers.gcp import GcpProvider

logger = logging.getLogger(__name__)

CLOUDS: Final = ("aws", "gcp")
HOURLY: Final = "carbon_avg_g_per_kwh"
YEARLY: Final = "carbon_avg_yearly_g_per_kwh"
CARBON_LOOKBACK_S: Final = 7 * 86400.0  # how far back the state store is asked for samples
CHECK_REQUEST: Final = "heliotrope-check"
OFFERS_CHECK: Final = "ec2:DescribeInstanceTypes/-TypeOfferings/SpotPriceHistory"
_CLUSTER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_STORE_KEY = re.compile(r"^(aws|gcp):[a-z0-9-]+$")
# Secrets that may sit in the environment of a `providers check`: never printed.
SECRET_ENV: Final = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
                     "AWS_ACCESS_KEY_ID")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")


# -- settings ---------------------------------------------------------------------------------


class AwsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    regions: list[str] = Field(min_length=1)
    image_id: str | dict[str, str] | None = None
    ami_parameter: str | None = None
    instance_profile: str | None = None
    subnet_ids: dict[str, str] = Field(default_factory=dict)
    security_group_ids: list[str] = Field(default_factory=list)
    pricing_region: str = "us-east-1"
    endpoint_urls: dict[str, str] = Field(default_factory=dict)  # VPC endpoints by service


class GcpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1)
    zones: list[str] = Field(min_length=1)
    billing_api_key_env: str | None = None  # the NAME of the variable that holds the key
    api_endpoint: str | None = None  # a Private Service Connect endpoint, or a test server
    billing_endpoint: str | None = None
    boot_image: str | None = None
    boot_disk_gb: int | None = Field(default=None, gt=0)
    network: str | None = None
    subnetwork: str | None = None
    external_ip: bool = False
    service_account: str | None = None


class CloudSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: str
    providers: list[Literal["aws", "gcp"]] = Field(min_length=1)
    aws: AwsSettings | None = None
    gcp: GcpSettings | None = None
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
    def _consistent(self) -> CloudSettings:
        if not _CLUSTER.fullmatch(self.cluster):
            raise ValueError(f"cluster {self.cluster!r}: 1-63 letters, digits, '.', '_' or '-'")
        if len(set(self.providers)) != len(self.providers):
            raise ValueError("providers: list each cloud once")
        for name in self.providers:
            if getattr(self, name) is None:
                raise ValueError(f"providers lists {name} but there is no `{name}:` section")
        for key, uri in self.checkpoints.items():
            if key != "default" and not _STORE_KEY.fullmatch(key):
                raise ValueError(f"checkpoints: key {key!r} is not `default` or `<cloud>:<region>`")
            try:
                uri.format(cloud="aws", region="r", cluster="c")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"checkpoints[{key}]: {uri!r} may use only {{cloud}}, "
                                 f"{{region}} and {{cluster}} ({exc})") from None
        return self

    def store_uri(self, cloud: str, region: str) -> str | None:
        """The checkpoint store of a region, or None when the settings name none."""
        uri = self.checkpoints.get(f"{cloud}:{region}") or self.checkpoints.get("default")
        if uri is None:
            return None
        return uri.format(cloud=cloud, region=region, cluster=self.cluster)


def settings_path(path: Path | None = None) -> Path:
    return path or home() / "clouds.yaml"


def load_cloud_settings(path: Path | None = None) -> CloudSettings:
    path = settings_path(path)
    if not path.is_file():
        raise InputError(str(path), "", "a clouds settings file", got="missing",
                         fix="write one (docs/providers.md, 'Several clouds at once') or pass "
                             "--config")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        settings = CloudSettings.model_validate(raw)
    except yaml.YAMLError as exc:
        raise InputError(str(path), "", "valid YAML", got=str(exc).splitlines()[0]) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "(file)"
        raise InputError(str(path), where, "valid cloud settings (docs/providers.md)",
                         got=first.get("msg", str(exc))) from exc
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
        raise InputError("", "--cloud", "configured clouds: " + ", ".join(settings.providers),
                         got=", ".join(unknown) or repr(text))
    return list(dict.fromkeys(wanted))


# -- providers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class CloudAccess:
    """How to reach the clouds, when not by their standard credential chains: a boto3
    session factory (an assumed role, a test's hooks), Google credentials, and the sleep
    retries use (default: the clock's)."""

    aws_session_factory: SessionFactory | None = None
    gcp_credentials: Credentials | None = None
    sleep: Callable[[float], None] | None = None


def make_aws(settings: CloudSettings, *, clock: Clock, access: CloudAccess) -> AwsProvider:
    from providers.aws import DEFAULT_AMI_PARAMETER, AwsProvider

    a = settings.aws
    if a is None:
        raise InputError("clouds settings", "aws", "an `aws:` section", got="none")
    return AwsProvider(
        cluster=settings.cluster,
        regions=a.regions,
        session_factory=access.aws_session_factory,
        clock=clock,
        pricing_region=a.pricing_region,
        image_id=a.image_id,
        ami_parameter=a.ami_parameter or DEFAULT_AMI_PARAMETER,
        instance_profile=a.instance_profile,
        subnet_ids=a.subnet_ids,
        security_group_ids=a.security_group_ids,
        sleep=access.sleep,
        endpoint_urls=a.endpoint_urls or None,
    )


def make_gcp(settings: CloudSettings, *, clock: Clock, access: CloudAccess) -> GcpProvider:
    from providers.gcp import GcpLaunchConfig, GcpProvider
    from providers.gcp.billing import BILLING_ENDPOINT

    g = settings.gcp
    if g is None:
        raise InputError("clouds settings", "gcp", "a `gcp:` section", got="none")
    overrides: dict[str, Any] = {
        "boot_image": g.boot_image,
        "boot_disk_gb": g.boot_disk_gb,
        "network": g.network,
        "subnetwork": g.subnetwork,
        "service_account": g.service_account,
    }
    config = GcpLaunchConfig(external_ip=g.external_ip,
                             **{k: v for k, v in overrides.items() if v is not None})
    return GcpProvider(
        cluster=settings.cluster,
        project=g.project,
        zones=g.zones,
        credentials=access.gcp_credentials,
        client_options={"api_endpoint": g.api_endpoint} if g.api_endpoint else None,
        clock=clock,
        billing_api_key=billing_key(g),
        launch_config=config,
        billing_endpoint=g.billing_endpoint or BILLING_ENDPOINT,
        sleep=access.sleep,
    )


def billing_key(g: GcpSettings) -> str | None:
    if not g.billing_api_key_env:
        return None
    return os.environ.get(g.billing_api_key_env) or None


def make_providers(
    settings: CloudSettings,
    *,
    clock: Clock,
    access: CloudAccess | None = None,
    clouds: Sequence[str] | None = None,
) -> dict[str, ComputeProvider]:
    """One adapter per configured cloud (or per cloud of `clouds`), by name."""
    access = access or CloudAccess()
    out: dict[str, ComputeProvider] = {}
    for name in clouds or settings.providers:
        if name == "aws":
            out[name] = make_aws(settings, clock=clock, access=access)
        elif name == "gcp":
            out[name] = make_gcp(settings, clock=clock, access=access)
        else:
            raise InputError("clouds settings", "providers", "aws or gcp", got=repr(name))
    return out


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
    def build(zones: Iterable[str], *, trace: Trace | None = None,
              store: StateStore | None = None, now_s: float | None = None) -> CarbonIndex:
        from orchestrator.signals.scenario import GRID_ZONES

        zones = sorted(set(zones))
        index = CarbonIndex()
        if trace is not None:
            index.max_age_s = {**index.max_age_s, **{m: trace.max_age_s(m) for m in
                                                     DEFAULT_MAX_AGE_S}}
            rows = trace.grid[trace.grid["grid_zone"].isin(zones)]
            for metric, target in ((HOURLY, index.hourly), (YEARLY, None)):
                sel = rows[rows["metric"] == metric]
                for z, t, v, s in zip(sel["grid_zone"], sel["time"], sel["value"],
                                      sel["source"], strict=True):
                    if not math.isfinite(float(v)):
                        continue
                    item = (pd.Timestamp(t).timestamp(), float(v), f"trace {s}".strip())
                    if target is not None:
                        target.setdefault(str(z), []).append(item)
                    elif str(z) not in index.yearly or item[0] >= index.yearly[str(z)][0]:
                        index.yearly[str(z)] = item
            index.extra_rows = rows[~rows["metric"].isin([HOURLY, YEARLY])]
        if store is not None and now_s is not None:
            for sample in store.samples(SignalKind.CARBON, zones, now_s - CARBON_LOOKBACK_S,
                                        now_s + 1.0):
                if math.isfinite(sample.value):
                    index.hourly.setdefault(sample.key, []).append(
                        (sample.time.timestamp(), float(sample.value), f"store {sample.source}"))
        for series in index.hourly.values():
            series.sort(key=lambda x: x[0])
        for z in zones:
            if z not in index.yearly and z in GRID_ZONES:
                index.yearly[z] = (float("nan"), float(GRID_ZONES[z].yearly_g),
                                   "scenario, Electricity Maps 2024")
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


def carbon_sources(settings: CloudSettings, traces: Path | None) -> tuple[Trace | None,
                                                                        StateStore | None]:
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
    no_store = sorted({f"{o.cloud}:{o.region}" for o in offers
                       if settings.store_uri(o.cloud, o.region) is None})
    if no_store:
        logger.warning("no checkpoint store for %s: their offers are left out (add them to "
                       "`checkpoints:`)", ", ".join(no_store))
    usable = tuple(o for o in offers
                   if settings.store_uri(o.cloud, o.region) is not None and o.id in quotes)
    if not usable:
        raise InputError("clouds settings", "providers", "at least one offer with a price "
                         "and a checkpoint store", got="none",
                         fix="run `heliotrope providers check` and fill `checkpoints:`")
    priors = list_priors(usable, live.spot_capacity,
                         {k: q.usd_per_hour for k, q in quotes.items()})

    def store_uri(offer: Offer) -> str:
        uri = settings.store_uri(offer.cloud, offer.region)
        if uri is None:  # only offers with a store are in the world: a bug if it happens
            raise InputError("clouds settings", "checkpoints", f"a store for {offer.cloud}:"
                             f"{offer.region}", got="none")
        return uri

    return World(live, multi, usable, clock, priors, store_uri=store_uri,
                 progress_from_provider=False, entrypoint=tuple(settings.entrypoint),
                 extra={"cluster": settings.cluster, "quotes": quotes})


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
        rows.append((per_gpu, o.id, {
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
        }))
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
    if gpu and catalog.canonical_gpu_name(gpu) is None and not any(
        g.split("-", 1)[0] == gpu.strip().upper() for g in catalog.GPUS
    ):
        raise InputError("", "--gpu", "a GPU type: " + ", ".join(sorted(catalog.GPUS)),
                         got=repr(gpu))
    clock = clock or SystemClock()
    providers = make_providers(settings, clock=clock, access=access, clouds=clouds)
    multi = MultiProvider(list(providers.values()))
    offers = multi.offers()
    quotes = multi.quotes()
    trace, store = carbon_sources(settings, traces)
    now_s = clock.now().timestamp()
    carbon = CarbonIndex.build({o.grid_zone for o in offers}, trace=trace, store=store,
                               now_s=now_s)
    return offer_rows(offers, quotes, carbon, now_s, gpu=gpu, market=market)


# -- `heliotrope providers check` ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckResult:
    provider: str
    check: str
    result: Literal["ok", "fail", "skip"]
    reason: str

    def row(self) -> dict[str, str]:
        return {"provider": self.provider, "check": self.check, "result": self.result,
                "reason": self.reason}


class _Redactor:
    """Removes secrets (credential values from the environment, the billing key, anything
    shaped like an AWS access key id) from what a check prints."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return _AWS_KEY_ID.sub("***", " ".join(text.split()))[:400]


def check_providers(
    settings: CloudSettings,
    *,
    clouds: Sequence[str] | None = None,
    clock: Clock | None = None,
    access: CloudAccess | None = None,
) -> list[CheckResult]:
    """Credentials and permissions of each configured cloud, one row per check."""
    clock = clock or SystemClock()
    access = access or CloudAccess()
    gcp_key = billing_key(settings.gcp) if settings.gcp is not None else None
    redact = _Redactor([*(os.environ.get(n) for n in SECRET_ENV), gcp_key])
    results: list[CheckResult] = []
    for name in clouds or settings.providers:
        try:
            if name == "aws":
                found = _check_aws(settings, make_aws(settings, clock=clock, access=access),
                                   access)
            else:
                found = _check_gcp(settings, make_gcp(settings, clock=clock, access=access),
                                   access)
        except HeliotropeError as exc:
            found = [CheckResult(name, "settings", "fail", str(exc))]
        results += [CheckResult(r.provider, r.check, r.result, redact(r.reason)) for r in found]
    return results


def _aws_client(session: Any, service: str, region: str, settings: AwsSettings) -> Any:
    from botocore.config import Config

    return session.client(service, region_name=region,
                          endpoint_url=settings.endpoint_urls.get(service),
                          config=Config(retries={"total_max_attempts": 2, "mode": "standard"},
                                        user_agent_extra="heliotrope-check",
                                        connect_timeout=10, read_timeout=30))


def _check_aws(settings: CloudSettings, provider: AwsProvider,
               access: CloudAccess) -> list[CheckResult]:
    from providers.aws._session import default_session
    from providers.aws.errors import error_code, failure_of, is_aws_error
    from providers.aws.instances import parse_offer_id
    from providers.aws.offers import SOURCE_PRICING
    from providers.aws.userdata import render
    from providers.base import LaunchSpec

    a = settings.aws
    assert a is not None
    out: list[CheckResult] = []

    def add(check: str, result: Literal["ok", "fail", "skip"], reason: str) -> None:
        out.append(CheckResult("aws", check, result, reason))

    def failed(check: str, exc: BaseException) -> None:
        if isinstance(exc, HeliotropeError):
            add(check, "fail", str(exc))
        elif is_aws_error(exc):
            add(check, "fail", failure_of(exc, action=check).message)
        else:
            raise exc

    regions = provider.regions
    try:
        session = (access.aws_session_factory or default_session)()
        who = _aws_client(session, "sts", regions[0], a).get_caller_identity()
        add("sts:GetCallerIdentity", "ok", f"account {who.get('Account')}, {who.get('Arn')}")
    except Exception as exc:
        failed("sts:GetCallerIdentity", exc)
        add("ec2 and pricing", "skip", "no usable AWS credentials (see above)")
        return out

    instances: Mapping[str, Any] = {}
    try:
        instances = provider.list_instances(cluster=settings.cluster)
        add("ec2:DescribeInstances", "ok",
            f"{len(instances)} instance(s) of cluster {settings.cluster} in {', '.join(regions)}")
    except Exception as exc:
        failed("ec2:DescribeInstances", exc)

    book = None
    try:
        book = provider.offer_book(refresh=True)
        per_region = {r: [o for o in book.offers if o.region == r] for r in regions}
        missing = [r for r, found in per_region.items() if not found]
        spot = sum(o.market is Market.SPOT for o in book.offers)
        if missing:
                add(OFFERS_CHECK, "fail", f"no offers read in {', '.join(missing)} (see the log)")
        else:
            add(OFFERS_CHECK, "ok",
                f"{len(book.offers)} offers ({spot} spot) in {', '.join(regions)}")
        on_demand = [o for o in book.offers if o.market is Market.ON_DEMAND]
        if not on_demand:
            add("pricing:GetProducts", "skip", "no on-demand offers to price")
        elif any(book.price_source.get(o.id) == SOURCE_PRICING for o in on_demand):
            add("pricing:GetProducts", "ok", "on-demand prices from the Pricing API")
        else:
            add("pricing:GetProducts", "fail",
                "the Pricing API gave no price (see the log); catalog list prices are used")
    except Exception as exc:
        failed(OFFERS_CHECK, exc)

    for region in regions:
        check = f"ec2:RunInstances dry run {region}"
        usd = {} if book is None else book.usd_per_hour
        offers = [] if book is None else sorted(
            (o for o in book.offers if o.region == region and o.id in usd),
            key=lambda o: (o.market is not Market.SPOT, usd[o.id], o.id))
        if not offers:
            add(check, "skip", "no priced offer in this region to try")
            continue
        offer = offers[0]
        parsed = parse_offer_id(offer.id)
        assert parsed is not None
        zone, instance_type, market = parsed
        request_id = f"{CHECK_REQUEST}-{uuid.uuid4().hex[:12]}"
        try:
            spec = LaunchSpec(job_id=CHECK_REQUEST, offer_id=offer.id, cluster=settings.cluster,
                              entrypoint=("true",))
            user_data = render(entrypoint=spec.entrypoint, env={}, job_id=spec.job_id,
                               cluster=settings.cluster, request_id=request_id, gang_size=1)
            # Exactly the request a launch sends (tags, IMDSv2, market options), as a dry run:
            # the IAM policy's conditions on tags and metadata options are checked too.
            params = dict(provider._run_params(spec, request_id, zone, instance_type, market,
                                               provider._ami(region), user_data))
            _aws_client(session, "ec2", region, a).run_instances(**params, DryRun=True)
            add(check, "fail", "the dry run was not refused: EC2 ignored DryRun")
        except Exception as exc:
            if is_aws_error(exc) and error_code(exc) == "DryRunOperation":
                add(check, "ok", f"allowed: {market.value} {instance_type} in {zone}, tagged "
                                 f"heliotrope:cluster={settings.cluster}, IMDSv2")
            else:
                failed(check, exc)

    by_region: dict[str, str] = {}
    for instance_id, info in sorted(instances.items()):
        parsed = parse_offer_id(info.offer_id)
        if parsed is not None:
            by_region.setdefault(catalog.region_of_zone("aws", parsed[0]), instance_id)
    for region in regions:
        check = f"ec2:TerminateInstances dry run {region}"
        victim = by_region.get(region)
        if victim is None:
            add(check, "skip", f"no instance of cluster {settings.cluster} here to try (the "
                               "policy lets it terminate only instances tagged with its cluster)")
            continue
        try:
            _aws_client(session, "ec2", region, a).terminate_instances(
                InstanceIds=[victim], DryRun=True)
            add(check, "fail", "the dry run was not refused: EC2 ignored DryRun")
        except Exception as exc:
            if is_aws_error(exc) and error_code(exc) == "DryRunOperation":
                add(check, "ok", f"allowed on {victim} (cluster {settings.cluster})")
            else:
                failed(check, exc)
    return out


def _check_gcp(settings: CloudSettings, provider: GcpProvider,
               access: CloudAccess) -> list[CheckResult]:
    from providers.gcp.billing import SOURCE_BILLING
    from providers.gcp.provider import CLOUD_PLATFORM_SCOPE

    g = settings.gcp
    assert g is not None
    out: list[CheckResult] = []

    def add(check: str, result: Literal["ok", "fail", "skip"], reason: str) -> None:
        out.append(CheckResult("gcp", check, result, reason))

    if access.gcp_credentials is not None:
        add("credentials", "ok", f"given by the caller ({type(access.gcp_credentials).__name__})")
    else:
        import google.auth
        from google.auth import exceptions as auth_exceptions

        try:
            creds, project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
        except auth_exceptions.GoogleAuthError as exc:
            add("credentials", "fail", f"no Application Default Credentials: "
                                       f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            add("compute", "skip", "no usable Google credentials (see above)")
            return out
        who = getattr(creds, "service_account_email", None) or ""
        add("credentials", "ok", "application default credentials "
                                 f"({type(creds).__name__}{', ' + who if who else ''}"
                                 f"{', project ' + project if project else ''})")

    zones = ", ".join(provider.zones)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("compute.machineTypes.list",
         lambda: f"{len(provider.offers())} offers in {zones}"),
        ("compute.instances.list",
         lambda: f"{len(provider.list_instances(cluster=settings.cluster))} instance(s) of "
                 f"cluster {settings.cluster} in project {g.project}"),
        ("compute.zoneOperations.list",
         lambda: f"preemption operations readable in {zones} "
                 f"({len(provider.poll_events())} of ours)"),
    ]
    for check, run in checks:
        try:
            add(check, "ok", run())
        except HeliotropeError as exc:
            add(check, "fail", str(exc))
    add("compute.instances.create", "skip",
        "Compute Engine has no dry run; infra/gcp/role.yaml grants it and the first launch "
        "reports AUTH if it is missing")
    if not g.billing_api_key_env:
        add("cloudbilling.services.skus.list", "skip",
            "no billing_api_key_env: list prices are used")
    elif billing_key(g) is None:
        add("cloudbilling.services.skus.list", "fail",
            f"${g.billing_api_key_env} is not set: list prices are used")
    else:
        try:
            sources = {q.source for q in provider.prices().values()}
        except HeliotropeError as exc:
            add("cloudbilling.services.skus.list", "fail", str(exc))
        else:
            if SOURCE_BILLING in sources:
                add("cloudbilling.services.skus.list", "ok", "prices from the Cloud Billing "
                                                             "Catalog")
            else:
                add("cloudbilling.services.skus.list", "fail",
                    "the Cloud Billing Catalog gave no price (the key was refused or the API "
                    "failed; see the log): list prices are used")
    return out
