"""Helpers for the scale tests: a fresh PostgreSQL schema, a scenario fleet, one simulated
cloud shared by several controller processes, and the checks on what they committed.

The shared cloud is a `SimProvider` living in a `multiprocessing` manager process: every
controller launches, terminates and polls the *same* instances, as two controllers of one
real fleet would, so an action a controller performed but never committed (an orphan
instance) or an instance launched twice for one job is visible, not hidden in a private
simulator per process.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from multiprocessing.managers import BaseManager
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from orchestrator.clock import FakeClock
from orchestrator.model import Event, EventKind, InstanceId, JobSpec, Offer, Phase
from orchestrator.signals.grid import SignalGrid
from providers.base import (
    Capability,
    InstanceInfo,
    LaunchOutcome,
    LaunchSpec,
    ProviderEvent,
)
from providers.sim import SimProvider

PG_URL = os.environ.get("HELIOTROPE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
START = datetime(2024, 4, 1, tzinfo=UTC)
CLUSTER = "scale"
HOME_REGIONS = ("us-east-1", "us-west-2", "us-central1", "europe-west4", "europe-west1")


# -- PostgreSQL --------------------------------------------------------------------------


@cache
def pg_unavailable() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when they can."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]>=3.2')"
    parts = urlsplit(PG_URL)
    host, port = parts.hostname or "127.0.0.1", parts.port or 5432
    try:
        with socket.create_connection((host, port), timeout=1.0):
            pass
    except OSError as exc:
        return f"PostgreSQL not reachable at {host}:{port} ({exc}); set HELIOTROPE_TEST_PG_URL"
    return None


def with_options(url: str, options: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options={options}"


@contextmanager
def pg_schema(prefix: str = "heliotrope_scale") -> Iterator[str]:
    """A fresh schema in the test database, dropped afterwards; yields a URL whose
    search_path is that schema (so the store, and the fleet lock's key, live in it)."""
    from orchestrator.state.sql import make_engine

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = make_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        yield with_options(PG_URL, f"-csearch_path%3D{name}")
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        admin.dispose()


# -- the fleet ---------------------------------------------------------------------------


def scenario_jobs(n: int, seed: int = 0) -> list[JobSpec]:
    """`n` single-GPU jobs starting over the first six hours, due in two to four days."""
    rng = np.random.default_rng(seed)
    return [
        JobSpec(
            id=f"job-{i:05d}",
            work_gpu_hours=float(rng.uniform(4.0, 40.0)),
            gpus=1,
            start=START + timedelta(minutes=10 * int(rng.integers(0, 36))),
            deadline=START + timedelta(hours=float(rng.uniform(40.0, 72.0))),
            checkpoint_size_gb=10.0,
            cold_start_h=0.1,
            home_region=HOME_REGIONS[i % len(HOME_REGIONS)],
            gpu_types=frozenset({"A100-80GB", "H100", "L4", "V100"}),
            checkpoint_interval_h=0.5,
        )
        for i in range(n)
    ]


def scenario_grid(jobs: Sequence[JobSpec], seed: int = 0, tick_s: int = 600) -> SignalGrid:
    """The built-in scenario over the jobs' window, spot gaps realized (replay's grid)."""
    from orchestrator.replay.runner import build_grid
    from orchestrator.signals.scenario import generate

    days = (max(j.deadline for j in jobs) - START).total_seconds() / 86400.0 + 1.0
    return build_grid(generate(seed, days, start=START, tick_s=tick_s), jobs, tick_s, seed)


def store_uri(offer: Offer) -> str:
    """Checkpoint stores per region (the simulated jobs write none)."""
    return f"memory://heliotrope-scale/{offer.region}"


# -- one cloud shared by every controller -------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaunchRecord:
    request_id: str
    job_id: str
    offer_id: str
    instance_id: str | None  # None: refused
    time_s: float
    caller: str


class SharedCloud:
    """A `SimProvider` and its clock, served by a manager process to every controller.

    Records every launch request (repeats of a request id included) with the caller."""

    def __init__(self, grid: SignalGrid, cluster: str = CLUSTER) -> None:
        self.grid = grid
        self.clock = FakeClock(grid.start)
        self.sim = SimProvider(grid, self.clock, cluster=cluster)
        self.requests: list[LaunchRecord] = []

    def set_tick(self, k: int) -> None:
        self.clock.set(self.grid.time_of(k))

    def launch(self, spec: LaunchSpec, request_id: str, caller: str) -> LaunchOutcome:
        outcome = self.sim.launch(spec, request_id=request_id)
        self.requests.append(
            LaunchRecord(
                request_id,
                spec.job_id,
                spec.offer_id,
                outcome.instance_id,
                self.clock.now().timestamp(),
                caller,
            )
        )
        return outcome

    def terminate(self, ids: Sequence[InstanceId], request_id: str) -> None:
        self.sim.terminate(ids, request_id=request_id)

    def poll_events(self) -> list[ProviderEvent]:
        return self.sim.poll_events()

    def list_instances(self, cluster: str) -> dict[InstanceId, InstanceInfo]:
        return dict(self.sim.list_instances(cluster=cluster))

    def launch_log(self) -> list[LaunchRecord]:
        return list(self.requests)

    def live_per_job(self) -> dict[str, list[InstanceId]]:
        out: dict[str, list[InstanceId]] = defaultdict(list)
        for info in self.sim.list_instances(cluster=CLUSTER).values():
            out[info.job_id].append(info.id)
        return dict(out)


class CloudManager(BaseManager):
    pass


CloudManager.register("SharedCloud", SharedCloud)


class CloudProvider:
    """The `ComputeProvider` a controller process uses: calls go to the shared cloud."""

    name = "sim"

    def __init__(self, cloud: Any, offers: Sequence[Offer], caller: str) -> None:
        self._cloud = cloud
        self._offers = tuple(offers)
        self._caller = caller

    def capabilities(self) -> frozenset[Capability]:
        return frozenset({Capability.SPOT, Capability.ON_DEMAND})

    def offers(self) -> Sequence[Offer]:
        return self._offers

    def list_instances(self, *, cluster: str) -> Mapping[InstanceId, InstanceInfo]:
        result: dict[InstanceId, InstanceInfo] = self._cloud.list_instances(cluster)
        return result

    def launch(self, spec: LaunchSpec, *, request_id: str) -> LaunchOutcome:
        outcome: LaunchOutcome = self._cloud.launch(spec, request_id, self._caller)
        return outcome

    def terminate(self, ids: Sequence[InstanceId], *, request_id: str) -> None:
        self._cloud.terminate(list(ids), request_id)

    def poll_events(self) -> list[ProviderEvent]:
        events: list[ProviderEvent] = self._cloud.poll_events()
        return events


# -- checks ------------------------------------------------------------------------------


@dataclass
class Findings:
    """What the checks found; empty lists mean the run was clean."""

    double_launches: list[str] = field(default_factory=list)
    bad_order: list[str] = field(default_factory=list)
    final_mismatch: list[str] = field(default_factory=list)
    double_migrations: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    ghosts: list[str] = field(default_factory=list)
    shared_requests: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def problems(self) -> dict[str, list[str]]:
        return {k: v[:10] for k, v in vars(self).items() if isinstance(v, list) and v}


def check_fleet(
    history: Mapping[str, Sequence[Event]],
    rows: Mapping[str, Any],
    migrations: Sequence[Mapping[str, Any]] | None,
    cloud_launches: Sequence[LaunchRecord] | None,
    live: Mapping[str, Sequence[InstanceId]] | None,
) -> Findings:
    """Check every job's committed history against itself, its row, its migration
    records, and (when given) what the shared cloud saw.

    - a LAUNCHED only when the job holds no instance and has not finished; TERMINATED,
      PREEMPTED and FINISHED only when it holds one (of that id when named), FINISHED once;
      no migration planned after FINISHED;
    - the row agrees with the events: phase DONE iff the job finished, the instance it
      holds, the number of launches and preemptions;
    - MIGRATION events open ("planned") and close ("-> done" / "-> failed") without
      overlapping, one migration record per "planned";
    - every instance the cloud created is in exactly one LAUNCHED event, and every
      LAUNCHED instance came from the cloud (no orphan, no double launch, no request id
      behind two LAUNCHED events); at most one live instance per job, it is the one the
      row names, and every instance a row names is alive (no event the fleet missed).
    """
    f = Findings()
    launched_by: dict[str, str] = {}
    planned_per_job: Counter[str] = Counter()
    for job_id, events in history.items():
        holds, done = "", False  # the instance the job holds; work complete
        launches = preemptions = 0
        open_migration = False
        for e in events:
            f.counts[e.kind.value] += 1
            at = f"{job_id} at {e.time_s:.0f}: {e.kind.value}"
            if e.kind is EventKind.LAUNCHED:
                if holds or done:
                    f.double_launches.append(
                        f"{at} {e.instance_id} while holding {holds!r}{' (done)' if done else ''}"
                    )
                if e.instance_id in launched_by:
                    f.shared_requests.append(
                        f"{e.instance_id}: launched for {launched_by[e.instance_id]} and {job_id}"
                    )
                launched_by[e.instance_id] = job_id
                holds = e.instance_id
                launches += 1
            elif e.kind in (EventKind.TERMINATED, EventKind.PREEMPTED):
                if not holds:
                    f.bad_order.append(f"{at} holding nothing")
                elif e.instance_id and e.instance_id != holds:
                    f.bad_order.append(f"{at} {e.instance_id}, holding {holds}")
                preemptions += e.kind is EventKind.PREEMPTED
                holds = ""
            elif e.kind is EventKind.FINISHED:
                # Modelled completion keeps the instance until the planner terminates it;
                # a completion the job reported comes with its (released) instance.
                if done or not holds:
                    f.bad_order.append(f"{at} holding {holds!r}{' (done)' if done else ''}")
                done = True
                if e.instance_id:
                    holds = ""
            elif e.kind is EventKind.MIGRATION:
                if e.detail.startswith("planned:"):
                    planned_per_job[job_id] += 1
                    if open_migration:
                        f.double_migrations.append(f"{at} planned over an open one")
                    if done:
                        f.bad_order.append(f"{at} planned after finishing")
                    open_migration = True
                elif "-> done" in e.detail or "-> failed" in e.detail:
                    if not open_migration:
                        f.double_migrations.append(f"{at} closed one never opened")
                    open_migration = False
        row = rows[job_id]
        if (Phase(row.phase) is Phase.DONE) != done:
            f.final_mismatch.append(
                f"{job_id}: row phase {Phase(row.phase).name}, events "
                f"say {'done' if done else 'not done'}"
            )
        if (row.instance_id or "") != holds:
            f.final_mismatch.append(
                f"{job_id}: row instance {row.instance_id!r}, events say {holds!r}"
            )
        if row.launches != launches or row.preemptions != preemptions:
            f.final_mismatch.append(
                f"{job_id}: row launches/preemptions {row.launches}/"
                f"{row.preemptions}, events {launches}/{preemptions}"
            )
    if migrations is not None:
        records: Counter[str] = Counter(m["job_id"] for m in migrations)
        opened: Counter[str] = Counter(
            m["job_id"] for m in migrations if m["phase"] not in ("done", "failed")
        )
        for job_id in set(records) | set(planned_per_job):
            if records[job_id] != planned_per_job[job_id]:
                f.double_migrations.append(
                    f"{job_id}: {planned_per_job[job_id]} planned, "
                    f"{records[job_id]} migration records"
                )
            if opened[job_id] > 1:
                f.double_migrations.append(f"{job_id}: {opened[job_id]} open migrations")
    if cloud_launches is not None:
        created: dict[str, LaunchRecord] = {}
        for r in cloud_launches:
            if r.instance_id is not None:
                created.setdefault(r.instance_id, r)
        for instance_id, r in created.items():
            if instance_id not in launched_by:
                f.orphans.append(
                    f"{instance_id} ({r.job_id}, request {r.request_id} by "
                    f"{r.caller}) is in no LAUNCHED event"
                )
        for instance_id, job_id in launched_by.items():
            if instance_id not in created:
                f.orphans.append(f"{job_id}: LAUNCHED {instance_id} the cloud never made")
        per_request: defaultdict[str, set[str]] = defaultdict(set)
        for r in cloud_launches:
            if r.instance_id is not None:
                per_request[r.request_id].add(r.instance_id)
        f.shared_requests += [
            f"request {q} made {sorted(i)}" for q, i in per_request.items() if len(i) > 1
        ]
    if live is not None:
        alive = {i for ids in live.values() for i in ids}
        f.ghosts += [
            f"{job_id}: row holds {row.instance_id}, which the cloud no longer runs"
            for job_id, row in rows.items()
            if row.instance_id and row.instance_id not in alive
        ]
        for job_id, ids in live.items():
            if len(ids) > 1:
                f.double_launches.append(f"{job_id}: {len(ids)} live instances {ids}")
            elif (rows[job_id].instance_id or "") != ids[0]:
                f.orphans.append(f"{job_id}: live {ids[0]}, row says {rows[job_id].instance_id!r}")
    return f


def store_snapshot(
    url: str,
) -> tuple[dict[str, list[Event]], dict[str, Any], list[dict[str, Any]], int]:
    """Every job's history, its row, every migration record and the version."""
    import sqlalchemy as sa

    from orchestrator.state import open_store
    from orchestrator.state import schema as t

    store = open_store(url)
    try:
        loaded, version = store.load()
        history: dict[str, list[Event]] = {job.id: [] for job in loaded.jobs}
        since = 0
        while True:
            batch = store.events(since_id=since, limit=50_000)
            if not batch:
                break
            for event_id, e in batch:
                history[e.job_id].append(e)
                since = event_id
        with store.engine.connect() as conn:
            migrations = [dict(r) for r in conn.execute(sa.select(t.migrations)).mappings()]
        return history, dict(loaded.rows), migrations, version
    finally:
        store.close()


# -- the controller processes -------------------------------------------------------------


def controller_process(name: str, conn: Any) -> None:
    """One controller process, set up and driven over `conn`.

    ("setup", (url, grid, policy, cloud, use_lock)) -> ("ready", pid): a `LiveController`
    over the store at `url` and the shared cloud, with a `FleetLock` when `use_lock`.
    ("tick", k) -> ("ticked", holds the lock, seconds); ("release", _) -> ("released", ...);
    ("stop", _) -> ("stats", {commits, conflicts, standby, ticks})."""
    import logging
    import traceback

    logging.disable(logging.WARNING)  # refused launches and failed moves are routine here
    try:
        _serve(name, conn)
    except Exception:
        conn.send(("error", traceback.format_exc(), 0.0))


def _serve(name: str, conn: Any) -> None:
    import time

    from orchestrator.live.controller import LiveController
    from orchestrator.live.fleet_lock import FleetLock
    from orchestrator.loop import LoopOptions
    from orchestrator.state import open_store
    from policies.registry import make_policy

    msg, (url, grid, policy, cloud, use_lock) = conn.recv()
    assert msg == "setup", msg
    clock = FakeClock(grid.start)
    store = open_store(url, clock=clock)
    lock = FleetLock(url) if use_lock else None
    live = LiveController(
        store=store,
        provider=CloudProvider(cloud, grid.offers, name),
        policy=make_policy(policy),
        grid=grid,
        clock=clock,
        store_uri=store_uri,
        options=LoopOptions(cluster=CLUSTER),
        lock=lock,
    )
    conn.send(("ready", os.getpid(), 0.0))
    try:
        while True:
            msg, arg = conn.recv()
            if msg == "tick":
                clock.set(grid.time_of(arg))
                t = time.perf_counter()
                live.tick()
                conn.send(("ticked", lock is None or lock.held, time.perf_counter() - t))
            elif msg == "release":
                if lock is not None:
                    lock.release()
                conn.send(("released", False, 0.0))
            elif msg == "stop":
                stats = {
                    "commits": live.commits,
                    "conflicts": live.conflicts,
                    "standby": live.standby_ticks,
                    "ticks": live.ticks,
                }
                conn.send(("stats", stats, None))
                return
    finally:
        if lock is not None:
            lock.release()
        store.close()
