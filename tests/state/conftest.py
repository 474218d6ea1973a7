"""Fixtures for the state store tests: one behavioural suite over three backends.

`backend` is parametrized over the in-memory store, a SQLite file and PostgreSQL. The
PostgreSQL URL is $HELIOTROPE_TEST_PG_URL or postgresql://postgres@127.0.0.1:5432/test;
each test gets its own schema (dropped afterwards) through the URL's search_path, and the
tests skip with the reason when the server or the psycopg driver is missing.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from orchestrator.clock import FakeClock
from orchestrator.model import JobSpec
from orchestrator.state import MemoryStateStore, StateStore, open_store

PG_URL = os.environ.get("HELIOTROPE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
T0 = datetime(2024, 3, 1, tzinfo=UTC)


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


def require_pg() -> None:
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)


@contextmanager
def pg_schema() -> Iterator[str]:
    """A fresh PostgreSQL schema; yields a URL whose search_path is that schema."""
    require_pg()
    from orchestrator.state.sql import make_engine

    name = f"heliotrope_test_{uuid.uuid4().hex[:12]}"
    admin = make_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}options=-csearch_path%3D{name}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        admin.dispose()


@dataclass
class Backend:
    """One database for one test; `open()` gives another store on the same database
    (the memory backend has one store, so `open()` returns it again)."""

    name: str
    url: str | None
    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))
    opened: list[Any] = field(default_factory=list)

    def open(self) -> StateStore:
        if self.url is None:
            if not self.opened:
                self.opened.append(MemoryStateStore(clock=self.clock))
            store: StateStore = self.opened[0]
            return store
        store = open_store(self.url, clock=self.clock)
        self.opened.append(store)
        return store

    def close(self) -> None:
        for store in self.opened:
            store.close()


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        b = Backend("memory", None)
        yield b
    elif request.param == "sqlite":
        b = Backend("sqlite", f"sqlite:///{tmp_path / 'state.db'}")
        yield b
        b.close()
    else:
        with pg_schema() as url:
            b = Backend("postgresql", url)
            try:
                yield b
            finally:
                b.close()


@pytest.fixture
def store(backend: Backend) -> StateStore:
    return backend.open()


def make_job(i: int, **overrides: Any) -> JobSpec:
    values: dict[str, Any] = dict(
        id=f"job-{i:03d}",
        work_gpu_hours=10.0 + i,
        gpus=1 + i % 4,
        # a non-UTC offset on purpose: the store gives back the same instant in UTC
        start=(T0 + timedelta(hours=i)).astimezone(timezone(timedelta(hours=2))),
        deadline=T0 + timedelta(days=3, microseconds=123),
        checkpoint_size_gb=12.5,
        cold_start_h=0.1,
        home_region="us-east-1",
        gpu_types=frozenset({"A100-80GB", "H100"}) if i % 2 else frozenset(),
        throughput={"H100": 2.25} if i % 2 else {},
        budget_usd=500.0 if i % 3 == 0 else None,
        checkpoint_interval_h=0.5,
        launcher="none" if i % 5 == 0 else "torchrun",
    )
    values.update(overrides)
    return JobSpec(**values)
