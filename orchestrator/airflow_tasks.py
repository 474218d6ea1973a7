"""The bodies of Heliotrope's Airflow tasks: plain functions, each one call into orchestrator.

The DAG files in ``dags/`` stay thin: a task reads what only Airflow knows (its params, a
Variable, a Connection, the run id), hands plain values to a function here, and turns the
two outcomes Airflow has words for into Airflow's exceptions:

- `Skip` (signals too old to act on) -> ``AirflowSkipException`` with the reason;
- `InputError` (a refused migration, a bad replay parameter) -> ``AirflowFailException``:
  retrying cannot fix what a person asked for.

This module imports the standard library only at the top, so a DAG file may import it while
it is parsed; everything heavy (pandas, SQLAlchemy, the replay) is imported inside the
function that needs it, when a task runs. Airflow itself is imported only by the glue at the
end (`in_airflow`, `airflow_credentials`), inside a running task: every body is tested
without a scheduler.

Settings: what the CLI reads (``$HELIOTROPE_HOME/config.yaml``: database, policy, scenario
speed, ...) and, for the tasks, the Airflow Variable ``heliotrope`` (JSON, see
`TaskSettings`: which home, trace dir, regions, sources, signal age). Credentials come from
Airflow Connections, read inside a task (`credentials_from`) and handed to the signal
sources; they are never logged.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Final, Protocol, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    field_validator,
    model_validator,
)

from orchestrator.errors import InputError, Refused, TransientError, expected_of

logger = logging.getLogger(__name__)

#: The Airflow Variable holding Heliotrope's task settings (JSON).
VARIABLE: Final = "heliotrope"

#: Airflow Connection ids, by the credential family they carry.
CONNECTION_IDS: Final[Mapping[str, str]] = {
    "aws": "aws_default",
    "gcp": "google_cloud_default",
    "electricitymaps": "electricitymaps_default",
    "watttime": "watttime_default",
    "entsoe": "entsoe_default",
    "eia": "eia_default",
}

# -- what the DAG files read while Airflow parses them ---------------------------------------
#
# A DAG file may import this module and nothing else of ours while it is parsed (the parse
# test: no policies, providers, orchestrator.signals/live/replay, numpy or pandas), yet its
# task groups, param enums and form suggestions need these names. So they are written out
# here, and tests/dags/test_task_bodies.py and tests/providers/test_registry.py keep each
# equal to the registry it copies. Task bodies (run time) read the real registries instead.

#: The signals DAG's task groups: one task per family, mapped over regions. Cloud families
#: poll the regions of their cloud: the cloud registry's `cloud_families()` (each cloud with
#: signal sources, its price then capacity sources). Grid families (defined here) poll
#: every region, by its grid zone. Together they are `orchestrator.signals.poll.SOURCE_NAMES`.
SIGNAL_FAMILIES: Final[Mapping[str, tuple[str, ...]]] = {
    "aws": ("aws-spot-price", "aws-ondemand", "aws-placement-score", "aws-spot-advisor"),
    "gcp": ("gcp-billing",),
    "carbon": ("electricitymaps", "watttime", "uk-carbon"),
    "power": (
        "caiso-curtailment",
        "entsoe-prices",
        "entsoe-generation",
        "eia930",
        "caiso-prices",
        "ercot-prices",
        "spp-prices",
        "miso-prices",
        "pjm-prices",
        "nyiso-prices",
        "isone-prices",
    ),
}

#: The regions of the local world (`orchestrator.live.world.LOCAL_REGIONS`), offered as
#: suggestions in the migrate form.
LOCAL_REGION_NAMES: Final = ("us-east-1", "eu-north-1", "us-central1", "europe-west4")

#: Policy names a replay may run (`policies.registry.POLICY_NAMES`): the replay form's enum.
REPLAY_POLICY_CHOICES: Final = (
    "on-demand",
    "spot-failover",
    "uniform-progress",
    "carbon-greedy",
    "curtailment-threshold",
    "heliotrope",
    "heliotrope-lookahead",
    "oracle",
)

#: Policies a replay runs when none are given (`orchestrator.replay.service.DEFAULT_POLICIES`).
DEFAULT_REPLAY_POLICIES: Final = (
    "heliotrope",
    "on-demand",
    "spot-failover",
    "uniform-progress",
    "carbon-greedy",
    "curtailment-threshold",
)


def cloud_families() -> dict[str, tuple[str, ...]]:
    """The cloud families of the signals DAG, from the cloud registry: each registered cloud
    with price or capacity signal sources, named after it."""
    from providers import registry

    return {s.name: s.signal_sources for s in registry.specs() if s.signal_sources}


def signal_families() -> dict[str, tuple[str, ...]]:
    """The families a task polls, at run time: the registry's cloud families, then the grid
    families of `SIGNAL_FAMILIES`."""
    grid = {k: v for k, v in SIGNAL_FAMILIES.items() if k in ("carbon", "power")}
    return {**cloud_families(), **grid}


class PollFailed(TransientError):
    """A poll read nothing and at least one source failed for a reason other than a
    missing credential (a timeout, a 5xx, a malformed answer): worth a retry."""


class Skip(Exception):
    """This run has nothing safe to do; `reason` says why. A DAG task turns it into
    ``AirflowSkipException(reason)``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- settings ------------------------------------------------------------------------------


def _names(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise Refused("a list of names")
    return tuple(v for v in value if v)


def _seconds(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise Refused("seconds > 0")
    return float(value)


Names = Annotated[tuple[str, ...], BeforeValidator(_names)]


class TaskSettings(BaseModel):
    """What the Airflow tasks need beyond the CLI's config file.

    From the Variable ``heliotrope`` (every key optional)::

        {"home": "/srv/heliotrope",          # HELIOTROPE_HOME for the tasks
         "trace_dir": "/srv/heliotrope/signals",  # where polled samples are appended
         "regions": ["us-east-1", "europe-west4"],  # regions the signals DAG polls
         "sources": ["uk-carbon", ...],      # signal sources to poll (default: all)
         "signal_max_age_s": 3600}           # rebalance with require_polled: older skips

    `home` defaults to ``$HELIOTROPE_HOME`` (else ``~/.heliotrope``), `trace_dir` to the
    home's ``signals``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: Path
    trace_dir: Path
    regions: Names = ()
    sources: Names = ()
    signal_max_age_s: Annotated[float, BeforeValidator(_seconds)] = 3600.0

    @model_validator(mode="before")
    @classmethod
    def _paths(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        home = out.get("home") or os.environ.get("HELIOTROPE_HOME") or "~/.heliotrope"
        home_dir = Path(str(home)).expanduser()
        trace_dir = Path(str(out.get("trace_dir") or home_dir / "signals")).expanduser()
        out["home"], out["trace_dir"] = str(home_dir), str(trace_dir)  # strings: JSON too
        return out

    @field_validator("sources")
    @classmethod
    def _known(cls, sources: tuple[str, ...]) -> tuple[str, ...]:
        known = [n for family in SIGNAL_FAMILIES.values() for n in family]
        for name in sources:
            if name not in known:
                raise Refused(f"signal sources among {', '.join(known)}; got {name!r}")
        return sources


def task_settings(variable: Mapping[str, Any] | str | None = None) -> TaskSettings:
    """Settings from the Variable's value (a mapping, its JSON text, or None when unset),
    over the environment (``$HELIOTROPE_HOME``). Unknown keys are refused, naming them."""
    where = f"Airflow Variable {VARIABLE!r}"
    try:
        if variable is None or variable == "":
            return TaskSettings.model_validate({})
        if isinstance(variable, str):
            return TaskSettings.model_validate_json(variable)
        return TaskSettings.model_validate(variable)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = str(err["loc"][0]) if err["loc"] else ""
        if err["type"] == "extra_forbidden":
            raise InputError(
                where,
                key,
                "one of the keys " + ", ".join(sorted(TaskSettings.model_fields)),
                fix="remove it (live settings belong in $HELIOTROPE_HOME/config.yaml)",
            ) from None
        if not key or err["type"] in ("json_invalid", "model_type"):
            raise InputError(where, "", "a JSON object", got=err["msg"]) from None
        raise InputError(where, key, expected_of(err), got=repr(err.get("input"))) from None


@contextlib.contextmanager
def heliotrope_home(settings: TaskSettings) -> Iterator[Path]:
    """Run the body with ``$HELIOTROPE_HOME`` set to the settings' home, as the CLI would
    see it; the old value comes back afterwards (``dag.test()`` runs tasks in-process)."""
    old = os.environ.get("HELIOTROPE_HOME")
    os.environ["HELIOTROPE_HOME"] = str(settings.home)
    try:
        yield settings.home
    finally:
        if old is None:
            os.environ.pop("HELIOTROPE_HOME", None)
        else:
            os.environ["HELIOTROPE_HOME"] = old


# -- credentials ---------------------------------------------------------------------------


class ConnectionLike(Protocol):
    """The part of an Airflow ``Connection`` read here."""

    @property
    def login(self) -> str | None: ...

    @property
    def password(self) -> str | None: ...

    @property
    def extra_dejson(self) -> dict[str, Any]: ...


class Credentials(Mapping[str, str]):
    """Credentials by the environment-variable name each signal source asks for
    (``ELECTRICITYMAPS_TOKEN``, ``WATTTIME_USERNAME``, ``AWS_ACCESS_KEY_ID`` ...): what
    ``SourceContext.credentials`` takes. Its repr and str name the keys, never a value, so a
    log line cannot leak a secret."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = {k: v for k, v in values.items() if v}

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Credentials({sorted(self._values)})"

    __str__ = __repr__


def credentials_from(get: Callable[[str], ConnectionLike | None]) -> Credentials:
    """Read the Connections of `CONNECTION_IDS` through `get` (conn id -> connection, None
    when absent) into the names the signal sources read (an absent Connection leaves the
    source to the process environment, and for AWS to boto3's own chain: profile, role):

    - ``aws_default``: login -> ``AWS_ACCESS_KEY_ID``, password -> ``AWS_SECRET_ACCESS_KEY``;
      extra ``region_name`` -> ``AWS_DEFAULT_REGION``, ``aws_session_token`` ->
      ``AWS_SESSION_TOKEN``, ``endpoint_url`` -> ``HELIOTROPE_AWS_ENDPOINT_URL``.
    - ``google_cloud_default``: password or extra ``api_key`` -> ``GCP_BILLING_API_KEY``
      (the Cloud Billing Catalog API key).
    - ``electricitymaps_default``: password (or extra ``token``) -> ``ELECTRICITYMAPS_TOKEN``.
    - ``watttime_default``: login -> ``WATTTIME_USERNAME``, password -> ``WATTTIME_PASSWORD``.
    - ``entsoe_default`` / ``eia_default`` (optional): password -> ``ENTSOE_TOKEN`` /
      ``EIA_API_KEY``.
    """
    out: dict[str, str] = {}
    for family, conn_id in CONNECTION_IDS.items():
        conn = get(conn_id)
        if conn is None:
            continue
        extra = {k: str(v) for k, v in (conn.extra_dejson or {}).items() if v not in (None, "")}
        login, password = conn.login or "", conn.password or ""
        if family == "aws":
            out["AWS_ACCESS_KEY_ID"] = login
            out["AWS_SECRET_ACCESS_KEY"] = password
            out["AWS_SESSION_TOKEN"] = extra.get("aws_session_token", "")
            out["AWS_DEFAULT_REGION"] = extra.get("region_name", "")
            out["HELIOTROPE_AWS_ENDPOINT_URL"] = extra.get("endpoint_url", "")
        elif family == "gcp":
            out["GCP_BILLING_API_KEY"] = password or extra.get("api_key", "")
        elif family == "electricitymaps":
            out["ELECTRICITYMAPS_TOKEN"] = password or extra.get("token", "")
        elif family == "watttime":
            out["WATTTIME_USERNAME"] = login
            out["WATTTIME_PASSWORD"] = password
        elif family == "entsoe":
            out["ENTSOE_TOKEN"] = password or extra.get("token", "")
        elif family == "eia":
            out["EIA_API_KEY"] = password or extra.get("api_key", "")
    return Credentials(out)


# -- signals -------------------------------------------------------------------------------


def signal_regions(settings: TaskSettings, family: str | None = None) -> list[str]:
    """The regions to poll, as ``cloud:region``: the Variable's ``regions`` (``aws:us-east-1``
    or a bare region name the catalog knows), else the live world's regions. For a cloud
    `family` (a cloud of the registry with signal sources) only that cloud's regions; grid
    families poll every region."""
    from orchestrator.live.world import LOCAL_REGIONS
    from providers import registry

    polled = [s for s in registry.specs() if s.signal_sources]  # registry order
    regions = {s.name: s.regions() for s in polled}
    out: list[str] = []
    for value in settings.regions or [name for name, _ in LOCAL_REGIONS]:
        cloud, sep, region = value.partition(":")
        if not sep:
            cloud, region = "", value
            cloud = next((c for c, known in regions.items() if region in known), "")
        if region not in regions.get(cloud, ()):
            titles = " or ".join(s.title for s in polled)
            raise InputError(
                f"Airflow Variable {VARIABLE!r}",
                "regions",
                f"{titles} regions of the catalog, e.g. aws:us-east-1 or europe-west4",
                got=repr(value),
            )
        if f"{cloud}:{region}" not in out:
            out.append(f"{cloud}:{region}")
    families = signal_families()
    if family is not None and family not in families:
        raise InputError("", "family", "one of " + ", ".join(families), got=family)
    want = family if family in regions else None
    return [r for r in out if want is None or r.startswith(want + ":")]


def poll_signals(
    settings: TaskSettings,
    *,
    family: str,
    region: str,
    credentials: Mapping[str, str] | None = None,
    now: datetime | None = None,
    base_urls: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Poll the sources of one family for one region (``cloud:region``) at `now` (default:
    the wall clock): samples go to the state store and are appended to the trace dir (under
    a file lock: mapped tasks run at once). Returns the poll's per-source table.

    `Skip` when no source of the family covers the region, or every one lacks its
    credential; `PollFailed` when nothing was read and some source failed otherwise."""
    from orchestrator.signals import poll

    names = _sources_to_poll(settings, family, region, credentials)
    cloud, _, name = region.partition(":")
    now = now or datetime.now(UTC)
    creds = dict(credentials or {})
    with heliotrope_home(settings):
        store = _open_store()
        try:
            report = poll.poll(
                names,
                None,
                now=now,
                store=store,
                regions=[(cloud, name)],
                credentials=creds,
                options=_aws_options(creds) if family == "aws" else None,
                base_urls=base_urls,
            )
        finally:
            store.close()
    written = [r.name for r in report.results if r.rows]
    if written:
        with _locked(settings.trace_dir):
            poll.record(settings.trace_dir, report.samples, now=now, sources=written)
    table = report.table()
    for row in table:
        logger.info("%s %s: %s", region, row["source"], {k: v for k, v in row.items() if v})
    if report.store_error:
        raise PollFailed(f"state store: {report.store_error}")
    if not written:
        _nothing_read(family, region, report.results)
    return {
        "family": family,
        "region": region,
        "rows": sum(r.rows for r in report.results),
        "trace_dir": str(settings.trace_dir),
        "sources": table,
    }


def _sources_to_poll(
    settings: TaskSettings, family: str, region: str, credentials: Mapping[str, str] | None
) -> list[str]:
    """The sources of `family` the Variable allows that cover `region`; `Skip` when none."""
    from orchestrator import catalog
    from orchestrator.signals import poll
    from orchestrator.signals.sources.base import SourceContext

    families = signal_families()
    if family not in families:
        raise InputError("", "family", "one of " + ", ".join(families), got=family)
    cloud, _, name = region.partition(":")
    names = [n for n in families[family] if not settings.sources or n in settings.sources]
    if family in cloud_families():
        if cloud != family:
            raise Skip(f"{family} sources do not cover {region}")
    else:
        zone = catalog.grid_zone(cloud, name)
        ctx = SourceContext(credentials=dict(credentials or {}))
        names = [n for n in names if zone and _covers(poll.make_source(n, ctx), zone)]
        if not names:
            raise Skip(
                f"no {family} source polled here covers {region} (grid zone {zone or 'unknown'})"
            )
    if not names:
        raise Skip(f"the Variable's `sources` leave no {family} source to poll")
    return names


def _nothing_read(family: str, region: str, results: Sequence[Any]) -> None:
    """A poll that wrote nothing: `Skip` when every failure is a missing credential or no
    network, `PollFailed` (worth a retry) when some source failed otherwise."""
    failed = [r for r in results if r.status == "failed"]
    missing = [r for r in failed if any(": credential: " in e for e in r.errors)]
    offline = [
        r for r in failed if r not in missing and r.errors and all(_offline(e) for e in r.errors)
    ]
    if failed and len(missing) + len(offline) == len(failed):
        conns = ", ".join(sorted(CONNECTION_IDS.values()))
        reasons = []
        if missing:
            reasons.append(
                f"no credentials for {', '.join(r.name for r in missing)}: add "
                f"the Airflow Connection ({conns}) or the environment variable "
                "the error names"
            )
        if offline:
            reasons.append(
                f"no network to {', '.join(r.name for r in offline)} (could "
                "not connect): check this worker's egress"
            )
        raise Skip("; ".join(reasons))
    if failed:
        raise PollFailed(
            f"{family} at {region}: nothing read; "
            + "; ".join(f"{r.name}: {' '.join(r.errors)[:200]}" for r in failed)
        )


def _offline(error: str) -> bool:
    """A source's error says the network is not there (no route, no DNS, refused, timed
    out), not that the service answered badly."""
    return any(
        word in error
        for word in ("ConnectionError", "timed out", "NameResolution", "Network is unreachable")
    )


def _covers(source: Any, zone: str) -> bool:
    covers = getattr(source, "covers", None)
    return bool(covers(zone)) if covers is not None else True


def _aws_options(creds: Mapping[str, str]) -> dict[str, Any] | None:
    """boto3 clients built from the ``aws_default`` Connection's key pair, when it has one;
    None leaves the AWS sources to boto3's own credential chain."""
    if not (creds.get("AWS_ACCESS_KEY_ID") and creds.get("AWS_SECRET_ACCESS_KEY")):
        return None
    from providers.aws._session import Clients

    def session() -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"],
            aws_session_token=creds.get("AWS_SESSION_TOKEN") or None,
            region_name=creds.get("AWS_DEFAULT_REGION") or None,
        )

    endpoint = creds.get("HELIOTROPE_AWS_ENDPOINT_URL") or os.environ.get(
        "HELIOTROPE_AWS_ENDPOINT_URL", ""
    )
    urls = {"ec2": endpoint, "pricing": endpoint} if endpoint else {}
    return {"aws_clients": Clients(session, endpoint_urls=urls)}


@contextlib.contextmanager
def _locked(trace_dir: Path) -> Iterator[None]:
    """An exclusive lock on the trace dir (a lock file beside it) while it is rewritten."""
    import fcntl

    trace_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(trace_dir.parent / f".{trace_dir.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open_store() -> Any:
    """The state store of ``$HELIOTROPE_HOME``, as the CLI opens it, without building the
    world."""
    from orchestrator.live.world import open_configured_store

    return open_configured_store()


# -- rebalance -----------------------------------------------------------------------------


def rebalance(settings: TaskSettings, *, require_polled: bool = False) -> dict[str, Any]:
    """One controller tick over the configured world: ``heliotrope controller run --once``.

    The tick accrues, observes and reconciles whatever the signals; when the signals the
    policy would decide on are stale (the world's view says so: nothing polled is fresh, or
    a scenario's grid has ended) it decides nothing, records why, and this raises `Skip`
    with the reason. With `require_polled`, the view's frame must rest on polled samples,
    none older than ``signal_max_age_s`` (`polled_reasons`), else it skips before the tick.
    Returns the tick's events and the fleet afterwards."""
    from orchestrator.live import commands
    from orchestrator.live.world import configured_world

    with heliotrope_home(settings):
        world = configured_world()
        now = world.clock.now()
        store = world.open_store()
        try:
            if require_polled:
                frame = world.view(store).frame(now.timestamp())
                reasons = polled_reasons(frame, settings.signal_max_age_s)
                if reasons:
                    raise Skip(
                        "signals are stale: "
                        + "; ".join(reasons[:10])
                        + (f" (+{len(reasons) - 10} more)" if len(reasons) > 10 else "")
                    )
            live = commands.live_controller(world, store, locked=True)
            try:
                events = live.tick()
                fleet = live.fleet_table()
                held = live.controller.held if live.controller is not None else ""
                standby = live.standby_ticks > 0
            finally:
                if live.lock is not None:  # one tick: let the next task (or controller) lead
                    live.lock.release()
        finally:
            store.close()
    if standby:
        raise Skip("another controller holds the fleet lock and acts this tick")
    for e in events:
        logger.info("%s %s %s %s", e.job_id, e.kind.value, e.offer_id, e.detail)
    if held:
        raise Skip(
            f"{held}; nothing was decided (accrual and reconcile ran; see `heliotrope events JOB`)"
        )
    return {
        "time": now.isoformat(),
        "events": [
            {"job": e.job_id, "kind": e.kind.value, "offer": e.offer_id, "detail": e.detail}
            for e in events
        ],
        "fleet": fleet,
    }


def polled_reasons(frame: Any, max_age_s: float) -> list[str]:
    """Why a tick that requires polled signals should not decide on `frame` (a
    `signals.view.SignalFrame`), by the live view's own rule: the frame's staleness (nothing
    polled counts any more); no basis (a scenario's grid, not polled signals); every signal
    of every offer on its prior (nothing polled, or nothing that still counts); a polled
    sample behind the frame older than `max_age_s`. Empty: decide."""
    if frame.stale:
        return [r.removeprefix("signals are stale: ") for r in frame.stale]
    basis = frame.basis
    if basis is None:
        return ["the world's signals are a scenario, not polled (config.yaml `signals`)"]
    offers = frame.grid.offers
    polled = [
        (signal, o)
        for signal, sources in basis.source.items()
        for o, src in enumerate(sources)
        if not src.startswith("prior")
    ]
    if not polled:
        return ["no polled signal counts now (every offer is on its priors)"]
    return [
        f"{signal} of {offers[o].id} from {basis.describe(o, signal)}"
        for signal, o in polled
        if float(basis.age_s[signal][o]) > max_age_s
    ]


# -- migrate -------------------------------------------------------------------------------


MARKET_CHOICES: Final = ("current", "spot", "on_demand")


def migrate(
    settings: TaskSettings,
    *,
    job: str,
    region: str,
    market: str | None = "current",
    dry_run: bool = True,
    force: bool = False,
) -> dict[str, Any]:
    """``heliotrope migrate JOB --to REGION [--market M] [--dry-run] [--force]``: the same
    checks and refusals (`InputError`: unknown job, done, already moving, no such region,
    misses the deadline or breaks the budget unless `force`), the same manual move through
    the controller's tick. Returns the plan; ``started`` is true when the move began."""
    from orchestrator.live import commands

    job = (job or "").strip()
    region = (region or "").strip()
    if not job:
        raise InputError(
            "params", "job", "the id of a submitted job", fix="see `heliotrope jobs list`"
        )
    if not region:
        raise InputError("params", "region", "a target region", got=repr(region))
    if market in (None, "", "current"):
        market = None
    elif market not in MARKET_CHOICES:
        raise InputError("params", "market", "one of " + ", ".join(MARKET_CHOICES), got=market)
    with heliotrope_home(settings):
        plan = commands.migrate(
            job, region, market=market, dry_run=bool(dry_run), force=bool(force)
        )
        if plan["started"]:
            store = _open_store()
            try:
                plan["fleet"] = [r for r in commands.jobs_table(store) if r["job"] == job]
            finally:
                store.close()
    logger.info("%s: %s", "started" if plan["started"] else "planned", plan)
    return plan


# -- replay --------------------------------------------------------------------------------


def replay(
    settings: TaskSettings,
    *,
    jobs_file: str,
    run_id: str = "manual",
    out_dir: str | Path | None = None,
    trace_dir: str | None = None,
    policies: Sequence[str] | str | None = None,
    carbon_price: float = 0.0,
    window_start: str | None = None,
    window_days: float | None = None,
    seed: int = 0,
    tick_minutes: float = 10.0,
) -> dict[str, Any]:
    """``heliotrope replay`` over a window: writes results.json, the CSVs, the plots and
    report.html under `out_dir` (default ``$HELIOTROPE_HOME/replays/<run_id>``), and
    returns their paths and the per-policy totals.

    The window: `window_start` (ISO time; default the trace's start) anchors jobs given as
    ``start_offset_h``; with `window_days`, only jobs that start inside [start, start +
    days) are replayed. Without `trace_dir` the built-in scenario is generated for the
    window (`window_days`, default 14)."""
    from orchestrator.replay.service import DAG_FIELDS, DEFAULT_POLICIES, ReplayRequest, parse_time
    from orchestrator.replay.service import replay as run

    if window_days is not None and not (window_days > 0):
        raise InputError("params", "window_days", "a positive number of days", got=window_days)
    start = parse_time(window_start, "window_start") if window_start else None
    traces = Path(trace_dir).expanduser() if trace_dir else None
    out = Path(out_dir).expanduser() if out_dir else settings.home / "replays" / _safe(run_id)
    request = ReplayRequest(
        jobs_file=Path(jobs_file).expanduser(),
        out_dir=out,
        policies=tuple(_policy_names(DEFAULT_POLICIES if policies is None else policies)),
        traces=traces,
        scenario_days=window_days or 14.0,
        scenario_start=start,
        anchor=start,
        carbon_usd_per_tonne=float(carbon_price),
        seed=seed,
        window=None if window_days is None else timedelta(days=window_days),
        tick_minutes=tick_minutes,
        names=DAG_FIELDS,
    )
    result = run(request)
    logger.info("replay report: %s", result.report)
    return {
        "report": str(result.report),
        "results": str(result.paths["results"]),
        "timeline": str(result.paths["timeline"]),
        "policies": {
            name: {k: v for k, v in row.items() if isinstance(v, int | float | str | None)}
            for name, row in _policy_rows(result.results).items()
        },
    }


def _safe(run_id: str) -> str:
    """A run id as one path component: ``manual__2024-01-01T00:00:00+00:00`` keeps its
    letters, digits, ``-``, ``_`` and ``.``; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id) or "run"


def _policy_names(policies: Sequence[str] | str) -> list[str]:
    if isinstance(policies, str):
        policies = policies.split(",")
    names = [p.strip() for p in policies if p and p.strip()]
    if not names:
        raise InputError("params", "policies", "at least one policy name")
    return names


def _policy_rows(res: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    pol = res.get("policies", {})
    if isinstance(pol, Mapping):
        return {str(k): v for k, v in pol.items() if isinstance(v, Mapping)}
    return {str(r.get("policy")): r for r in pol if isinstance(r, Mapping)}


# -- Airflow glue: imported lazily, only inside a running task -----------------------------

T = TypeVar("T")


def in_airflow(body: Callable[..., T], /, **kwargs: Any) -> T:
    """Run a task body inside Airflow: `body(settings, **kwargs)` with the settings from the
    Variable ``heliotrope``; `Skip` becomes ``AirflowSkipException`` and `InputError` (a
    refusal, a bad parameter) ``AirflowFailException``, which fails without retrying."""
    from airflow.sdk import Variable
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    try:
        settings = task_settings(Variable.get(VARIABLE, default=None))
        return body(settings, **kwargs)
    except Skip as skip:
        logger.info("skipped: %s", skip.reason)
        raise AirflowSkipException(skip.reason) from None
    except InputError as exc:
        logger.error("refused: %s", exc)
        raise AirflowFailException(str(exc)) from exc


def airflow_credentials() -> Credentials:
    """`credentials_from` the Airflow Connections (absent ones are skipped)."""
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    def get(conn_id: str) -> ConnectionLike | None:
        try:
            conn: ConnectionLike = Connection.get(conn_id)
        except AirflowNotFoundException:
            return None
        return conn

    return credentials_from(get)
