"""One acting controller per fleet: a lock that lives exactly as long as its holder.

Two controllers over one state store must never both act: the store's version check
(`VersionConflict`) refuses the second *commit*, but by then the loser has already called
the provider (a launch, a terminate), and nothing records it. So whoever acts holds the
fleet lock while it loads, decides, acts and commits:

- a long-running controller holds it across ticks (leader) and the others skip their
  ticks (standby) until it is free: `LiveController(..., lock=FleetLock(url))`;
- a one-shot tick (an Airflow task, `heliotrope migrate`) holds it for that tick:
  ``with FleetLock(url).hold(timeout_s=60): controller.tick()``.

Backends, chosen by the store URL:

- PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) on a connection of its
  own, keyed by the database and schema, so it dies with the holder's session (a crashed or
  partitioned controller loses it when the server drops the connection). `try_acquire`
  re-checks a held lock against ``pg_locks`` every time: a controller whose session was
  terminated learns it before its next tick.
- SQLite file: ``flock`` on ``<database>.fleet-lock`` next to the database (one machine).
- SQLite in memory (and no URL): a lock inside this process.

What it cannot prevent: a holder whose session is cut *while* it ticks keeps acting until
the tick ends, while another may already hold the lock. The version check then refuses
the stale commit; whatever it launched in that window is unrecorded.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final, Protocol

from orchestrator.errors import TransientError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Connection, Engine

logger = logging.getLogger(__name__)

#: First key of the two-key advisory lock ("HLIO"); the second is a hash of the schema.
PG_LOCK_CLASS: Final = 0x484C494F & 0x7FFFFFFF
_POLL_S: Final = 0.05


def pg_lock_key(schema: str) -> int:
    """The second key of the advisory lock for a fleet stored in `schema` (``pg_locks.objid``
    of the holder, with ``classid`` = `PG_LOCK_CLASS`)."""
    return zlib.crc32(schema.encode()) & 0x7FFFFFFF


class _Backend(Protocol):
    def try_lock(self) -> bool: ...

    def still_held(self) -> bool: ...

    def unlock(self) -> None: ...


class FleetLock:
    """The fleet's lock for the state store at `url` (default $HELIOTROPE_DB_URL).

    Not thread-safe; one per controller. `held` is what this object last knew;
    `try_acquire` verifies it."""

    def __init__(self, url: str | URL | None = None) -> None:
        from orchestrator.state.sql import resolve_url

        self.url = resolve_url(url)
        self._backend: _Backend = _backend_for(self.url)
        self.held = False

    def __repr__(self) -> str:
        where = self.url.render_as_string(hide_password=True)
        return f"FleetLock({where!r}, held={self.held})"

    def try_acquire(self) -> bool:
        """Hold the lock now, without waiting: True if this object holds it (taken now, or
        held before and still ours), False if another holder has it."""
        if self.held:
            if self._backend.still_held():
                return True
            logger.warning(
                "fleet lock on %s was lost (session gone); trying to retake it",
                self.url.render_as_string(hide_password=True),
            )
            self.held = False
        self.held = self._backend.try_lock()
        return self.held

    def acquire(self, timeout_s: float = 60.0) -> None:
        """Wait up to `timeout_s` for the lock; `TransientError` if another holder keeps it."""
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise TransientError(
                    f"the fleet lock on {self.url.render_as_string(hide_password=True)} is "
                    f"held by another controller (waited {timeout_s:g} s)",
                    retry_after_s=5.0,
                )
            time.sleep(_POLL_S)

    def release(self) -> None:
        """Let the lock go (a no-op when not held)."""
        if self.held:
            self.held = False
            self._backend.unlock()

    close = release

    @contextmanager
    def hold(self, timeout_s: float = 60.0) -> Iterator[FleetLock]:
        """Hold the lock for a block (one tick), waiting up to `timeout_s` for it."""
        self.acquire(timeout_s)
        try:
            yield self
        finally:
            self.release()

    def __enter__(self) -> FleetLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _backend_for(url: URL) -> _Backend:
    if url.get_backend_name() == "postgresql":
        return _PgLock(url)
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return _ProcessLock(url.render_as_string(hide_password=False))
    return _FileLock(Path(db).with_name(Path(db).name + ".fleet-lock"))


class _PgLock:
    """A session advisory lock on a dedicated connection (no pool: closing it ends the
    session, and so the lock)."""

    def __init__(self, url: URL) -> None:
        self._url = url
        self._engine: Engine | None = None
        self._conn: Connection | None = None
        self._key: int | None = None

    def _connect(self) -> Connection:
        import sqlalchemy as sa

        if self._conn is not None:
            return self._conn
        if self._engine is None:
            self._engine = sa.create_engine(
                self._url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT"
            )
        conn = self._engine.connect()
        if self._key is None:
            self._key = pg_lock_key(str(conn.scalar(sa.text("SELECT current_schema()"))))
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # the session is already gone
                logger.debug("closing a dead fleet-lock connection", exc_info=True)

    def try_lock(self) -> bool:
        import sqlalchemy as sa
        from sqlalchemy.exc import DBAPIError

        from orchestrator.state.sql import _errors

        try:
            with _errors():  # unreachable server: TransientError
                conn = self._connect()
                return bool(
                    conn.scalar(
                        sa.text("SELECT pg_try_advisory_lock(:c, :k)"),
                        {"c": PG_LOCK_CLASS, "k": self._key},
                    )
                )
        except (DBAPIError, TransientError):
            self._drop()  # next time, a new session
            raise

    def still_held(self) -> bool:
        import sqlalchemy as sa

        if self._conn is None:
            return False
        try:
            return bool(
                self._conn.scalar(
                    sa.text(
                        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                        "AND pid = pg_backend_pid() AND granted AND classid = :c AND objid = :k "
                        "AND objsubid = 2)"
                    ),
                    {"c": PG_LOCK_CLASS, "k": self._key},
                )
            )
        except Exception:  # the session died: so did the lock
            logger.debug("fleet-lock session check failed", exc_info=True)
            self._drop()
            return False

    def unlock(self) -> None:
        import sqlalchemy as sa

        if self._conn is not None:
            try:  # at once: a closed session's locks go only when its backend exits
                self._conn.execute(sa.text("SELECT pg_advisory_unlock_all()"))
            except Exception:  # the session is gone, and its locks with it
                logger.debug("fleet-lock unlock failed", exc_info=True)
        self._drop()


class _FileLock:
    """``flock`` on a file next to the SQLite database; the kernel drops it with the
    process."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd: int | None = None

    def try_lock(self) -> bool:
        import fcntl

        self._path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def still_held(self) -> bool:
        return self._fd is not None

    def unlock(self) -> None:
        import fcntl

        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


_PROCESS_LOCKS: dict[str, threading.Lock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


class _ProcessLock:
    """A lock shared by the FleetLocks of one in-memory database in this process."""

    def __init__(self, key: str) -> None:
        with _PROCESS_LOCKS_GUARD:
            self._lock = _PROCESS_LOCKS.setdefault(key, threading.Lock())
        self._mine = False

    def try_lock(self) -> bool:
        self._mine = self._lock.acquire(blocking=False)
        return self._mine

    def still_held(self) -> bool:
        return self._mine

    def unlock(self) -> None:
        if self._mine:
            self._mine = False
            self._lock.release()
