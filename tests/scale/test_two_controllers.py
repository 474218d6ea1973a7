"""Two controller processes over one fleet of 1,000 jobs in PostgreSQL, in lockstep on a
shared scenario clock, acting on one shared simulated cloud.

Each process runs a `LiveController` with a `FleetLock`: the holder of the lock ticks
(reload if another committed, migrations, decide, act, commit), the other stands by.
Leadership moves during the run, cleanly (the leader lets go, then sits out a tick, as a
restarting controller would) and by force (the test terminates the leader's lock session
on the server: a partitioned controller), so both processes act on the fleet, each taking
over the other's launches, preemptions and open migrations.

A third process runs the same scenario with one controller and no lock (in memory): the
reference. The checks: no job launched twice (no LAUNCHED without a TERMINATED, PREEMPTED
or FINISHED since the last; no request id behind two LAUNCHED events; at most one live
instance per job in the cloud after every tick), no migration planned over an open one,
every instance the cloud made is in the history (no orphans), every job's row agrees with
its events, the store's version equals the commits the controllers made, and the event
history is the reference's, event for event.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.clock import FakeClock
from orchestrator.model import Event, EventKind
from orchestrator.state import open_store
from tests.scale.fleet import (
    CloudManager,
    Findings,
    check_fleet,
    controller_process,
    pg_schema,
    pg_unavailable,
    scenario_grid,
    scenario_jobs,
    store_snapshot,
)

N_JOBS = 1000
N_TICKS = 200  # 33 h of scenario at 10-minute ticks
POLICY = "heliotrope"
#: After these ticks the leader lets go and sits out the next tick...
RELEASE_AT = (24, 74, 124, 174)
#: ...and after these its lock session is terminated on the server.
CUT_AT = (49, 99, 149)
REPLY_TIMEOUT_S = 60.0


class Proc:
    """A controller process and its end of the pipe."""

    def __init__(self, ctx: Any, name: str) -> None:
        self.name = name
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=controller_process, name=name, daemon=True, args=(name, child)
        )
        self.process.start()

    def send(self, msg: str, arg: Any = None) -> None:
        self.conn.send((msg, arg))

    def recv(self) -> tuple[str, Any, Any]:
        if not self.conn.poll(REPLY_TIMEOUT_S):
            raise AssertionError(f"{self.name} did not answer in {REPLY_TIMEOUT_S:g} s")
        reply: tuple[str, Any, Any] = self.conn.recv()
        if reply[0] == "error":
            raise AssertionError(f"{self.name} failed:\n{reply[1]}")
        return reply

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)


def _cut_lock_session(url: str) -> int:
    """Terminate the server session holding the fleet lock; returns how many."""
    import sqlalchemy as sa

    from orchestrator.live.fleet_lock import PG_LOCK_CLASS, pg_lock_key
    from orchestrator.state.sql import make_engine

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            key = pg_lock_key(str(conn.scalar(sa.text("SELECT current_schema()"))))
            n = conn.scalar(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = "
                    "'advisory' AND granted AND classid = :c AND objid = :k AND database = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database())"
                ),
                {"c": PG_LOCK_CLASS, "k": key},
            )
            return int(n or 0)
    finally:
        engine.dispose()


@dataclass
class Run:
    leaders: list[str]  # who held the lock at each tick
    leader_tick_s: list[float]
    cuts: int
    stats: dict[str, dict[str, int]]
    findings: Findings
    version: int
    history: dict[str, list[Event]]
    reference: dict[str, list[Event]]
    rows: dict[str, Any]
    reference_rows: dict[str, Any]
    reference_findings: Findings
    offers: int
    seconds: float


def _run(tmp_path: Path) -> Run:
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")
    # Start the processes first: they import while the scenario is generated.
    a, b, ref = (Proc(ctx, name) for name in ("a", "b", "reference"))
    procs = (a, b)
    try:
        jobs = scenario_jobs(N_JOBS)
        grid = scenario_grid(jobs)
        assert grid.n_ticks >= N_TICKS
        manager = CloudManager(ctx=ctx)
        manager.start()
        cloud: Any = manager.SharedCloud(grid)  # type: ignore[attr-defined]
        ref_cloud: Any = manager.SharedCloud(grid)  # type: ignore[attr-defined]
        with pg_schema() as url:
            store = open_store(url, clock=FakeClock(grid.start))
            store.submit(jobs)
            store.close()
            for p in procs:
                p.send("setup", (url, grid, POLICY, cloud, True))
            ref_url = f"sqlite:///{tmp_path / 'reference.db'}"
            ref_store = open_store(ref_url, clock=FakeClock(grid.start))
            ref_store.submit(jobs)
            ref_store.close()
            ref.send("setup", (ref_url, grid, POLICY, ref_cloud, False))
            for p in (a, b, ref):
                p.recv()
            leaders: list[str] = []
            tick_s: list[float] = []
            paused: set[str] = set()
            cuts = 0
            for k in range(N_TICKS):
                cloud.set_tick(k)
                ref_cloud.set_tick(k)
                ref.send("tick", k)
                active = [p for p in procs if p.name not in paused]
                for p in active:
                    p.send("tick", k)
                replies = {p.name: p.recv() for p in active}
                ref.recv()
                paused.clear()
                holding = [name for name, (_, held, _) in replies.items() if held]
                assert len(holding) == 1, f"tick {k}: lock held by {holding}"
                leaders.append(holding[0])
                tick_s.append(replies[holding[0]][2])
                doubled = {j: ids for j, ids in cloud.live_per_job().items() if len(ids) > 1}
                assert not doubled, f"tick {k}: jobs with two live instances: {doubled}"
                if k in RELEASE_AT:  # the leader lets go and sits out a tick
                    leader = a if holding[0] == "a" else b
                    leader.send("release")
                    leader.recv()
                    paused.add(leader.name)
                elif k in CUT_AT:  # the leader's lock session dies on the server
                    cuts += _cut_lock_session(url)
            stats = {}
            for p in procs:
                p.send("stop")
                stats[p.name] = p.recv()[1]
            ref.send("stop")
            ref.recv()
            history, rows, migrations, version = store_snapshot(url)
            ref_history, ref_rows, ref_migrations, _ = store_snapshot(ref_url)
        findings = check_fleet(history, rows, migrations, cloud.launch_log(), cloud.live_per_job())
        ref_findings = check_fleet(
            ref_history, ref_rows, ref_migrations, ref_cloud.launch_log(), ref_cloud.live_per_job()
        )
        manager.shutdown()
    finally:
        for p in (a, b, ref):
            p.stop()
    return Run(
        leaders,
        tick_s,
        cuts,
        stats,
        findings,
        version,
        history,
        ref_history,
        rows,
        ref_rows,
        ref_findings,
        len(grid.offers),
        time.perf_counter() - t0,
    )


def test_two_controllers_never_double_act(tmp_path: Path) -> None:
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    run = _run(tmp_path)
    leaders, findings = run.leaders, run.findings
    handovers = sum(x != y for x, y in itertools.pairwise(leaders))
    commits = sum(s["commits"] for s in run.stats.values())
    print(
        f"\ntwo controllers, {N_JOBS} jobs x {N_TICKS} ticks x {run.offers} offers: "
        f"{run.seconds:.1f} s; leader ticks a {leaders.count('a')} / b "
        f"{leaders.count('b')}, {handovers} handovers ({run.cuts} by a cut session); "
        f"leader tick mean {sum(run.leader_tick_s) / len(run.leader_tick_s):.3f} s, max "
        f"{max(run.leader_tick_s):.3f} s; events {dict(findings.counts)}; {run.stats}"
    )

    # Both acted on the fleet, taking over from each other.
    assert run.cuts == len(CUT_AT)
    assert handovers >= len(RELEASE_AT), leaders
    assert min(leaders.count("a"), leaders.count("b")) >= N_TICKS // 10, leaders
    assert findings.counts["launched"] > N_JOBS // 10  # the fleet did something
    assert findings.counts["preempted"] > 0 and findings.counts["migration"] > 0
    # No double action, consistent histories, a commit per tick (and one per phase the
    # tick's moves went through after the first), none refused.
    assert not findings.problems(), findings.problems()
    assert all(s["conflicts"] == 0 for s in run.stats.values()), run.stats
    assert run.version == commits >= N_TICKS, (run.version, commits)
    # One controller alone committed the same history, event for event: taking over
    # (reload, open migrations, the accrual start) changes no action and no number. Only the
    # reason a migration gives may differ: the migration driver keeps launch outcomes in
    # memory, so a new leader can report a rollback instance the old one launched as "not
    # seen" (the instance itself is the same, in the job's row and in the cloud).
    assert not run.reference_findings.problems(), run.reference_findings.problems()
    differ = [j for j in run.history if _key(run.history[j]) != _key(run.reference[j])]
    assert not differ, (
        f"{len(differ)} jobs differ from the single controller, e.g. {differ[0]}:\n"
        f"{_key(run.history[differ[0]])}\n{_key(run.reference[differ[0]])}"
    )
    # The same numbers: cost, energy, carbon, progress (no interval accrued twice or lost).
    numbers = [j for j in run.rows if run.rows[j] != run.reference_rows[j]]
    assert not numbers, (numbers[:5], run.rows[numbers[0]], run.reference_rows[numbers[0]])
    reasons = sum(
        x.detail != y.detail
        for j in run.history
        for x, y in zip(run.history[j], run.reference[j], strict=True)
    )
    print(f"  migration reasons that differ from the single controller's: {reasons}")


def _key(events: Any) -> list[tuple[Any, ...]]:
    """What happened, when, where, to which instance, which phase change, and the job's
    running totals the event carries."""
    return [
        (
            round(e.time_s, 3),
            e.kind.value,
            e.offer_id,
            e.instance_id,
            e.detail.split(":")[0] if e.kind is EventKind.MIGRATION else e.detail,
            sorted(e.data.items()),
        )
        for e in events
    ]
