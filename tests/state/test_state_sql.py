"""What only the SQL store has: SQLite settings, URLs, Alembic, and concurrent writers in
separate processes against one SQLite file and one PostgreSQL database."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from orchestrator.errors import InputError, TransientError
from orchestrator.model import Event, EventKind
from orchestrator.state import JobRow, VersionConflict, open_store, upgrade
from orchestrator.state.schema import metadata
from orchestrator.state.sql import (
    SQLITE_BUSY_TIMEOUT_MS,
    SqlStateStore,
    alembic_config,
    current_revision,
    head_revision,
    make_engine,
    resolve_url,
)
from tests.state.conftest import make_job, pg_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
    else:
        with pg_schema() as url:
            yield url


# -- SQLite -----------------------------------------------------------------------------------


def test_sqlite_pragmas(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        for _ in range(2):  # every pooled connection, not only the first
            with store.engine.connect() as a, store.engine.connect() as b:
                for conn in (a, b):
                    assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                    assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
                    assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
                    assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
    assert SQLITE_BUSY_TIMEOUT_MS == 30_000


def test_sqlite_writer_waits_for_the_lock_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    store = open_store(f"sqlite:///{path}")
    store.submit([make_job(1)])
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    result: dict[str, Any] = {}

    def write() -> None:
        t0 = time.perf_counter()
        try:
            result["version"] = store.commit([], {"job-001": JobRow(usd=1.0)}, expected_version=0)
        except Exception as exc:  # reported below
            result["error"] = exc
        result["waited_s"] = time.perf_counter() - t0

    thread = threading.Thread(target=write)
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # waiting on the busy timeout, not failed
    other.execute("COMMIT")
    other.close()
    thread.join(10)
    assert "error" not in result, result
    assert result["version"] == 1 and result["waited_s"] >= 0.45
    # readers are never blocked by a writer in WAL mode
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    t0 = time.perf_counter()
    assert store.load()[1] == 1
    assert time.perf_counter() - t0 < 0.5
    other.execute("ROLLBACK")
    other.close()
    store.close()


# -- URLs -------------------------------------------------------------------------------------


def test_resolve_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    psycopg = "postgresql+psycopg"
    assert resolve_url("postgresql://postgres@127.0.0.1:5432/test").drivername == psycopg
    assert resolve_url("postgres://u@h/db").drivername == psycopg
    assert resolve_url("postgresql+psycopg://u@h/db").drivername == psycopg
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_url("sqlite:///~/x/h.db").database == str(tmp_path / "x" / "h.db")
    assert resolve_url("sqlite://").database in (None, "")
    with pytest.raises(InputError, match="mysql"):
        resolve_url("mysql://u@h/db")
    with pytest.raises(InputError, match="database URL"):
        resolve_url("not a url")


def test_open_store_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HELIOTROPE_DB_URL", raising=False)
    with open_store() as store:
        assert store.engine.url.database == str(tmp_path / ".heliotrope" / "heliotrope.db")
        store.submit([make_job(1)])
    assert (tmp_path / ".heliotrope" / "heliotrope.db").is_file()
    monkeypatch.setenv("HELIOTROPE_DB_URL", f"sqlite:///{tmp_path / 'env.db'}")
    with open_store() as store:
        assert store.engine.url.database == str(tmp_path / "env.db")
        assert store.load()[0].jobs == ()


def test_in_memory_sqlite_url() -> None:
    with open_store("sqlite://") as store:
        store.submit([make_job(1)])
        assert store.commit([], {"job-001": JobRow(usd=2.0)}, expected_version=0) == 1
        assert store.load()[0].rows["job-001"].usd == 2.0


# -- Alembic ----------------------------------------------------------------------------------


def test_upgrade_is_idempotent_and_head_matches_metadata(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert current_revision(engine) is None
        upgrade(db_url)
        upgrade(db_url)
        assert current_revision(engine) == head_revision() == "0006"
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
            assert conn.execute(sa.text("SELECT id, version FROM meta")).all() == [(1, 0)]
        with open_store(db_url) as store:  # opening at head changes nothing
            store.submit([make_job(1)])
        upgrade(db_url)
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar() == 1
        # the revision also goes down and up again
        with engine.begin() as conn:
            cfg = alembic_config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "base")
        assert current_revision(engine) is None
        upgrade(db_url)
        assert current_revision(engine) == "0006"
    finally:
        engine.dispose()


# -- concurrent writers -----------------------------------------------------------------------

N_COMMITS = 200
THINK_S = 0.002


def _writer(url: str, name: str, barrier: Any, results: Any) -> None:
    """One process: open the store (racing the other on the schema upgrade), submit its
    job, then make N_COMMITS commits, retrying each on VersionConflict."""
    barrier.wait()
    store = open_store(url)
    job = f"job-{name}"
    store.submit([make_job(0, id=job)])
    barrier.wait()
    conflicts = 0
    latencies: list[float] = []
    for i in range(N_COMMITS):
        while True:
            version = store.version()
            t0 = time.perf_counter()
            try:
                store.commit(
                    [Event(float(i), job, EventKind.READY, detail=f"{name}:{i}")],
                    {job: JobRow(progress_gpu_h=float(i + 1))},
                    expected_version=version,
                )
                latencies.append(time.perf_counter() - t0)
                break
            except VersionConflict:
                conflicts += 1
        time.sleep(THINK_S)  # the rest of a tick: lets the other writer in
    store.close()
    results.put((name, conflicts, sorted(latencies)[len(latencies) // 2]))


def test_two_processes_commit_without_losing_anything(db_url: str) -> None:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(db_url, name, barrier, results)) for name in ("a", "b")
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    stats = sorted(results.get(timeout=5) for _ in procs)
    print(f"\n{db_url.partition(':')[0]}: (writer, conflicts, median commit s) {stats}")

    with SqlStateStore(make_engine(db_url)) as store:
        fleet, version = store.load()
        assert version == 2 * N_COMMITS
        for name in ("a", "b"):
            row = fleet.rows[f"job-{name}"]
            assert row.progress_gpu_h == N_COMMITS and row.version == N_COMMITS
            assert [e.detail for e in store.history(f"job-{name}")] == [
                f"{name}:{i}" for i in range(N_COMMITS)
            ]
        events = store.events(limit=10 * N_COMMITS)
        assert len(events) == 2 * N_COMMITS
        assert max(Counter(e.detail for _, e in events).values()) == 1
        ids = [i for i, _ in events]
        assert ids == sorted(ids)
        writers = [e.detail[0] for _, e in events]
        switches = sum(x != y for x, y in itertools.pairwise(writers))
        print(f"writer switches in commit order: {switches}")
        assert switches >= 10  # the writers really overlapped


def test_unreachable_postgres_is_a_transient_error() -> None:
    pytest.importorskip("psycopg", reason="psycopg is not installed")
    with pytest.raises(TransientError, match="unreachable"):
        open_store("postgresql://postgres@127.0.0.1:1/test")
