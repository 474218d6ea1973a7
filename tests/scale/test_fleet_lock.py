"""The fleet lock: one holder per fleet on PostgreSQL, a SQLite file and in memory; a lost
session is noticed; a `LiveController` with a lock stands by while another holds it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.clock import FakeClock
from orchestrator.errors import TransientError
from orchestrator.live.controller import LiveController
from orchestrator.live.fleet_lock import PG_LOCK_CLASS, FleetLock, pg_lock_key
from orchestrator.loop import LoopOptions
from orchestrator.model import JobSpec
from orchestrator.replay.runner import build_grid
from orchestrator.state import open_store
from orchestrator.state.sql import make_engine
from policies.registry import make_policy
from providers.sim import SimProvider
from tests.conftest import T0, tiny_trace
from tests.scale.fleet import pg_schema, pg_unavailable


@pytest.fixture
def pg_url() -> Iterator[str]:
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    with pg_schema("heliotrope_lock") as url:
        yield url


def _holders(url: str) -> list[int]:
    """Server sessions holding the fleet lock of `url`'s schema."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            key = pg_lock_key(str(conn.scalar(sa.text("SELECT current_schema()"))))
            return [
                int(p)
                for p in conn.scalars(
                    sa.text(
                        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                        "AND classid = :c AND objid = :k"
                    ),
                    {"c": PG_LOCK_CLASS, "k": key},
                )
            ]
    finally:
        engine.dispose()


def _terminate(url: str, pids: list[int]) -> None:
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            for pid in pids:
                conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    finally:
        engine.dispose()


def test_postgres_lock_has_one_holder(pg_url: str) -> None:
    a, b = FleetLock(pg_url), FleetLock(pg_url)
    try:
        assert a.try_acquire()
        assert a.try_acquire()  # still ours, not taken twice
        assert not b.try_acquire()
        assert len(_holders(pg_url)) == 1
        with pytest.raises(TransientError, match="held by another controller"):
            b.acquire(timeout_s=0.2)
        a.release()
        assert not a.held
        assert b.try_acquire()  # released at once, not when the session ends
        assert not a.try_acquire()
    finally:
        a.release()
        b.release()
    assert _holders(pg_url) == []


def test_postgres_lock_is_per_schema(pg_url: str) -> None:
    with pg_schema("heliotrope_lock") as other:
        a, b = FleetLock(pg_url), FleetLock(other)
        try:
            assert a.try_acquire()
            assert b.try_acquire()
        finally:
            a.release()
            b.release()


def test_postgres_lost_session_is_noticed(pg_url: str) -> None:
    a, b = FleetLock(pg_url), FleetLock(pg_url)
    try:
        assert a.try_acquire()
        _terminate(pg_url, _holders(pg_url))  # a's session dies on the server
        assert a.held  # a cannot know until it checks...
        assert b.try_acquire()
        assert not a.try_acquire()  # ...and then it is a standby
        assert not a.held
        b.release()
        assert a.try_acquire()  # and retakes the lock on a new session once it is free
    finally:
        a.release()
        b.release()


def test_hold_for_one_tick(pg_url: str) -> None:
    lock = FleetLock(pg_url)
    with lock.hold(timeout_s=1.0):
        assert lock.held
        assert not FleetLock(pg_url).try_acquire()
    assert not lock.held
    assert _holders(pg_url) == []


def test_sqlite_file_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    a, b = FleetLock(url), FleetLock(url)
    assert a.try_acquire()
    assert not b.try_acquire()
    assert (tmp_path / "fleet.db.fleet-lock").is_file()
    a.release()
    assert b.try_acquire()
    b.release()
    other = FleetLock(f"sqlite:///{tmp_path / 'other.db'}")
    with a, other:
        assert a.held and other.held


def test_in_memory_database_lock_is_per_process() -> None:
    a, b = FleetLock("sqlite://"), FleetLock("sqlite://")
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert b.try_acquire()
    b.release()


def _controller(url: str, lock: FleetLock | None) -> tuple[LiveController, FakeClock]:
    jobs = [
        JobSpec(
            id=f"j{i}",
            work_gpu_hours=4.0,
            gpus=1,
            start=T0,
            deadline=T0 + timedelta(hours=40),
            checkpoint_size_gb=1.0,
            cold_start_h=0.1,
            home_region="us-east-1",
        )
        for i in range(3)
    ]
    grid = build_grid(tiny_trace(), jobs, 600, 0)
    clock = FakeClock(grid.start)
    store = open_store(url, clock=clock)
    if not store.load()[0].jobs:
        store.submit(jobs)
    live = LiveController(
        store=store,
        provider=SimProvider(grid, clock, cluster="t"),
        policy=make_policy("on-demand"),
        grid=grid,
        clock=clock,
        store_uri=lambda o: f"memory://lock-test/{o.region}",
        options=LoopOptions(cluster="t"),
        lock=lock,
    )
    return live, clock


def test_controller_stands_by_while_another_holds_the_lock(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    leader, standby = FleetLock(url), FleetLock(url)
    a, clock_a = _controller(url, leader)
    b, clock_b = _controller(url, standby)
    try:
        assert a.tick()  # launches
        assert a.commits == 1
        clock_b.advance(600)
        assert b.tick() == []  # the lock is a's: b does nothing...
        assert (b.commits, b.standby_ticks, b.ticks) == (0, 1, 1)
        assert b.controller is None
        assert b.store.version() == 1
        leader.release()
        clock_a.advance(600)
        clock_b.advance(600)
        b.tick()  # ...until a lets go: b takes over from the store
        assert b.commits == 1 and b.store.version() == 2
        assert b.controller is not None
        assert b.controller.instance_of == a.controller.instance_of  # type: ignore[union-attr]
        assert a.tick() == []
        assert a.standby_ticks == 1 and a.controller is None
    finally:
        leader.release()
        standby.release()
        a.store.close()
        b.store.close()
