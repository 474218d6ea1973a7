"""The bodies of Heliotrope's Airflow tasks: plain functions, each one call into orchestrator.

The DAG files in ``dags/`` stay thin: a task reads what only Airflow knows (its params, a
Variable, a Connection, the run id), hands plain values to a function here, and turns the
two outcomes Airflow has words for into Airflow's exceptions:

- `Skip` (signals too old to act on) -> ``AirflowSkipException`` with the reason;
- `InputError` (a refused migration, a bad replay parameter) -> ``AirflowFailException``:
  retrying cannot fix what a person asked for.

This module imports the standard library only at the top, so a DAG file may import it while
it is parsed; everything heavy (pandas, SQLAlchemy, the replay) is imported inside the
function that needs it, when a task runs. Nothing here imports Airflow, so every body is
tested without a scheduler.

Settings, lowest precedence first: the Heliotrope config file (``$HELIOTROPE_HOME/
config.yaml``, what the CLI reads), then the Airflow Variable ``heliotrope`` (JSON, see
`TaskSettings`). Credentials come from Airflow Connections, read inside a task
(`credentials_from`) and handed to the signal sources; they are never logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

from orchestrator.errors import InputError

logger = logging.getLogger(__name__)

#: The Airflow Variable holding Heliotrope's task settings (JSON).
VARIABLE: Final = "heliotrope"

#: Airflow Connection ids, by the credential family they carry.
CONNECTION_IDS: Final[Mapping[str, str]] = {
    "aws": "aws_default",
    "gcp": "google_cloud_default",
    "electricitymaps": "electricitymaps_default",
    "watttime": "watttime_default",
}

#: The regions of the local world (orchestrator.live.world.LOCAL_REGIONS), offered as
#: suggestions in the migrate form. A test keeps the two in step.
LOCAL_REGION_NAMES: Final = ("us-east-1", "eu-north-1", "us-central1", "europe-west4")

#: Policy names a replay may run (policies.registry.POLICY_NAMES; a test keeps them in step).
REPLAY_POLICY_CHOICES: Final = (
    "on-demand",
    "spot-failover",
    "uniform-progress",
    "carbon-greedy",
    "curtailment-threshold",
    "heliotrope",
    "oracle",
)

#: Policies a replay runs when none are given (the CLI's default).
DEFAULT_REPLAY_POLICIES: Final = (
    "on-demand",
    "spot-failover",
    "uniform-progress",
    "carbon-greedy",
    "curtailment-threshold",
)


class Skip(Exception):
    """This run has nothing safe to do; `reason` says why. A DAG task turns it into
    ``AirflowSkipException(reason)``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSettings:
    """What the Airflow tasks need beyond the CLI's config file.

    From the Variable ``heliotrope`` (every key optional)::

        {"home": "/srv/heliotrope",          # HELIOTROPE_HOME for the tasks
         "trace_dir": "/srv/heliotrope/signals",  # where polled samples are appended
         "regions": ["us-east-1", "europe-west4"],  # regions the signals DAG polls
         "sources": ["aws_spot_price", ...],  # signal sources to poll (default: all)
         "signal_max_age_s": 3600}           # older signals: rebalance skips
    """

    home: Path
    trace_dir: Path
    regions: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    signal_max_age_s: float = 3600.0
    extra: Mapping[str, Any] = field(default_factory=dict)


_SETTING_KEYS: Final = frozenset({"home", "trace_dir", "regions", "sources", "signal_max_age_s"})


def task_settings(variable: Mapping[str, Any] | str | None = None) -> TaskSettings:
    """Settings from the Variable's value (a mapping, its JSON text, or None when unset),
    over the environment (``$HELIOTROPE_HOME``). Unknown keys are refused, naming them."""
    raw: Mapping[str, Any]
    if variable is None or variable == "":
        raw = {}
    elif isinstance(variable, str):
        try:
            loaded = json.loads(variable)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"Airflow Variable {VARIABLE!r}", "", "a JSON object", got=exc.msg
            ) from exc
        if not isinstance(loaded, dict):
            raise InputError(f"Airflow Variable {VARIABLE!r}", "", "a JSON object", got=loaded)
        raw = loaded
    else:
        raw = variable
    unknown = sorted(set(raw) - _SETTING_KEYS)
    if unknown:
        raise InputError(
            f"Airflow Variable {VARIABLE!r}",
            unknown[0],
            "one of the keys " + ", ".join(sorted(_SETTING_KEYS)),
            fix="remove it (live settings belong in $HELIOTROPE_HOME/config.yaml)",
        )
    home = Path(
        str(raw.get("home") or os.environ.get("HELIOTROPE_HOME") or "~/.heliotrope")
    ).expanduser()
    trace_dir = Path(str(raw.get("trace_dir") or home / "signals")).expanduser()
    max_age = raw.get("signal_max_age_s", 3600.0)
    if not isinstance(max_age, int | float) or isinstance(max_age, bool) or max_age <= 0:
        raise InputError(
            f"Airflow Variable {VARIABLE!r}", "signal_max_age_s", "seconds > 0", got=max_age
        )
    return TaskSettings(
        home=home,
        trace_dir=trace_dir,
        regions=_names(raw.get("regions"), "regions"),
        sources=_names(raw.get("sources"), "sources"),
        signal_max_age_s=float(max_age),
        extra=dict(raw),
    )


def _names(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InputError(f"Airflow Variable {VARIABLE!r}", key, "a list of names", got=value)
    return tuple(v for v in value if v)


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
    """Read the four Connections through `get` (conn id -> connection, None when absent)
    into the names the signal sources read (an absent Connection leaves the source to the
    process environment, and for AWS to boto3's own chain: profile, role):

    - ``aws_default``: login -> ``AWS_ACCESS_KEY_ID``, password -> ``AWS_SECRET_ACCESS_KEY``;
      extra ``region_name`` -> ``AWS_DEFAULT_REGION``, ``aws_session_token`` ->
      ``AWS_SESSION_TOKEN``.
    - ``google_cloud_default``: password or extra ``api_key`` -> ``GCP_API_KEY`` (Cloud
      Billing Catalog); extra ``key_path`` -> ``GOOGLE_APPLICATION_CREDENTIALS``, ``project``
      -> ``GOOGLE_CLOUD_PROJECT``.
    - ``electricitymaps_default``: password (or extra ``token``) -> ``ELECTRICITYMAPS_TOKEN``.
    - ``watttime_default``: login -> ``WATTTIME_USERNAME``, password -> ``WATTTIME_PASSWORD``.
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
        elif family == "gcp":
            out["GCP_API_KEY"] = password or extra.get("api_key", "")
            out["GOOGLE_APPLICATION_CREDENTIALS"] = extra.get("key_path", "")
            out["GOOGLE_CLOUD_PROJECT"] = extra.get("project", "")
        elif family == "electricitymaps":
            out["ELECTRICITYMAPS_TOKEN"] = password or extra.get("token", "")
        elif family == "watttime":
            out["WATTTIME_USERNAME"] = login
            out["WATTTIME_PASSWORD"] = password
    return Credentials(out)


# -- rebalance -----------------------------------------------------------------------------


def rebalance(settings: TaskSettings, *, require_polled: bool = False) -> dict[str, Any]:
    """One controller tick over the local world: ``heliotrope controller run --once``.

    Raises `Skip` instead of acting when the signals the policy would decide on are stale:
    the scenario clock is past the end of the world's signal grid, or (when polled signals
    are in use: the trace dir exists, or `require_polled`) a polled series is older than
    ``signal_max_age_s``. Returns the tick's events and the fleet afterwards."""
    from orchestrator.live import commands
    from orchestrator.live.world import local_world

    with heliotrope_home(settings):
        world = local_world()
        now = world.clock.now()
        grid_end = world.grid.time_of(world.grid.n_ticks)
        if now >= grid_end:
            raise Skip(
                f"signals are stale: the live world's signals end at {grid_end:%Y-%m-%d %H:%M} "
                f"UTC and its clock reads {now:%Y-%m-%d %H:%M} UTC; extend `days` in "
                f"{settings.home / 'config.yaml'}"
            )
        if require_polled or settings.trace_dir.exists():
            stale = stale_signals(settings, now=datetime.now(UTC))
            if stale:
                raise Skip("signals are stale: " + "; ".join(stale))
        live = commands.live_controller(world, world.open_store())
        events = live.tick()
        return {
            "time": now.isoformat(),
            "events": [
                {"job": e.job_id, "kind": e.kind.value, "offer": e.offer_id, "detail": e.detail}
                for e in events
            ],
            "fleet": live.fleet_table(),
        }


def stale_signals(settings: TaskSettings, *, now: datetime) -> list[str]:
    """Reasons, one per stale (source, region) series of the polled signals; empty when
    every series is fresh. Reads the trace dir the signals DAG writes."""
    from orchestrator.signals import poll

    report = poll.freshness(settings.trace_dir, now=now, max_age_s=settings.signal_max_age_s)
    return [str(r) for r in report]


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
            plan["fleet"] = [r for r in commands.jobs_table(_store()) if r["job"] == job]
    return plan


def _store() -> Any:
    from orchestrator.live.world import local_world

    return local_world().open_store()


# -- replay --------------------------------------------------------------------------------


def replay(
    settings: TaskSettings,
    *,
    jobs_file: str,
    run_id: str = "manual",
    out_dir: str | Path | None = None,
    trace_dir: str | None = None,
    policies: Sequence[str] | str = DEFAULT_REPLAY_POLICIES,
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
    from orchestrator.jobs import load_jobs
    from orchestrator.replay.metrics import write_outputs
    from orchestrator.replay.runner import run_replay
    from policies.registry import make_policy

    names = _policy_names(policies)
    if not math.isfinite(carbon_price) or carbon_price < 0:
        raise InputError("params", "carbon_price", "a price >= 0 USD per tonne", got=carbon_price)
    if tick_minutes <= 0 or tick_minutes * 60 != int(tick_minutes * 60):
        raise InputError(
            "params", "tick_minutes", "a positive whole number of seconds", got=tick_minutes
        )
    if window_days is not None and not (window_days > 0):
        raise InputError("params", "window_days", "a positive number of days", got=window_days)
    start = _iso_time(window_start, "window_start") if window_start else None
    policy_objs = [make_policy(n) for n in names]
    jobs_path = Path(jobs_file).expanduser()

    if trace_dir:
        from orchestrator.signals.traces import read_trace

        trace = read_trace(Path(trace_dir).expanduser())
        source = str(trace_dir)
    else:
        from orchestrator.signals.scenario import generate

        days = window_days or 14.0
        trace = generate(seed, days) if start is None else generate(seed, days, start=start)
        source = f"built-in scenario (seed {seed}, {days:g} days)"
    manifest_start = trace.manifest.get("start")
    if start is None and manifest_start:
        start = _iso_time(str(manifest_start), "the trace's manifest start")
    jobs = load_jobs(jobs_path, trace_start=start)
    if window_days is not None and start is not None:
        end = start + timedelta(days=window_days)
        kept = tuple(j for j in jobs if start <= j.start < end)
        if not kept:
            raise InputError(
                str(jobs_path),
                "jobs",
                f"at least one job starting in the window {start:%Y-%m-%d %H:%M} .. "
                f"{end:%Y-%m-%d %H:%M} UTC",
                got=f"{len(jobs)} job(s), none inside",
                fix="move the window (window_start, window_days) or the jobs",
            )
        if len(kept) < len(jobs):
            logger.info("window: replaying %d of %d jobs", len(kept), len(jobs))
        jobs = kept

    result = run_replay(
        trace,
        jobs,
        policy_objs,
        tick_s=int(tick_minutes * 60),
        seed=seed,
        carbon_usd_per_tonne=float(carbon_price),
    )
    extra = {"traces": source, "jobs_file": str(jobs_path)}
    out = Path(out_dir).expanduser() if out_dir else settings.home / "replays" / _safe(run_id)
    paths = write_outputs(result, out, extra_config=extra)
    res = json.loads(paths["results"].read_text())
    logger.info("replay report: %s", paths["report"])
    return {
        "report": str(paths["report"]),
        "results": str(paths["results"]),
        "timeline": str(paths["timeline"]),
        "policies": {
            name: {k: v for k, v in row.items() if isinstance(v, int | float | str | None)}
            for name, row in _policy_rows(res).items()
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


def _iso_time(text: str, what: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(
            "params", what, "an ISO 8601 time, e.g. 2024-04-01T00:00:00Z", got=text
        ) from exc
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


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
