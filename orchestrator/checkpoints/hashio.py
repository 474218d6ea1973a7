"""File wrappers that sha256 the bytes passing through them, chunk by chunk, on all cores.

A checkpoint file's digests are one sha256 per `chunk_bytes` piece (see `manifest`), so the
chunks of one file hash at once on a shared pool of threads (`hash_pool`, one per CPU), while
the caller's thread goes on reading or writing: `hashlib` releases the GIL on large buffers,
and so does file I/O. A write or read then costs about max(I/O, hashing / cores) instead of
their sum, and nothing is copied for hashing: the pool reads the caller's own buffers.

Both wrappers keep the contract of ordinary files (`write`, `readinto`: when they return,
the caller may reuse its buffer) and offer a faster variant for buffers that stay unchanged
until the file is closed (`write_stable`, `readinto_stable`): those return at once and the
hashing of the bytes finishes in the background; `close` (the writer) or `finish` (the
reader) waits for it, and the reader reports a corrupt chunk there at the latest.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from typing import IO, Final, TypeAlias

from orchestrator.checkpoints.errors import CorruptCheckpoint
from orchestrator.checkpoints.manifest import CHUNK_BYTES as HASH_CHUNK_BYTES

BytesLike: TypeAlias = bytes | bytearray | memoryview

CHUNK_BYTES: Final = 8 << 20
"""Granularity of streamed copies and of read/write system calls."""
_INLINE_BYTES: Final = 1 << 20
"""Below this, hash on the caller's thread: a hand-off costs more than it saves."""
FLUSH_EVERY_BYTES: Final = 64 << 20
"""Write-behind granularity of durable local writes."""

__all__ = [
    "CHUNK_BYTES",
    "HASH_CHUNK_BYTES",
    "CheckpointReader",
    "ChunkHasher",
    "DirectFile",
    "FileWriter",
    "Flusher",
    "chunk_differs",
    "hash_pool",
    "hash_workers",
]


def chunk_differs(
    uri: str, name: str, index: int, start: int, end: int, want: str, got: str
) -> CorruptCheckpoint:
    """The error for a chunk whose sha256 is not the manifest's."""
    return CorruptCheckpoint(
        uri,
        name,
        f"sha256 differs in chunk {index} (bytes {start}-{end}; manifest {want[:16]}…, "
        f"read {got[:16]}…)",
    )


def hash_workers() -> int:
    """Threads of the hashing pool: the CPUs this process may run on (2 at least, 32 at most)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(2, min(32, cpus))


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None


_POOL = _Pool()


def hash_pool() -> ThreadPoolExecutor:
    """The process-wide pool that hashes chunks (created on first use). Its jobs never wait
    for one another, so any thread may submit to it and wait for the result."""
    holder = _POOL
    if holder.executor is None:
        with holder.lock:
            if holder.executor is None:
                holder.executor = ThreadPoolExecutor(
                    max_workers=hash_workers(), thread_name_prefix="sha256"
                )
    return holder.executor


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _POOL  # noqa: PLW0603 - the child needs a new lock too
    _POOL = _Pool()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class _Chunk:
    """One chunk of a stream: its sha256, the pieces added but not handed to a job yet,
    and the job hashing it now (a chunk's jobs run one after another, in order)."""

    __slots__ = ("digest", "filled", "pending", "pending_bytes", "running", "sealed", "sha")

    def __init__(self) -> None:
        self.sha = hashlib.sha256()
        self.pending: list[memoryview] = []
        self.pending_bytes = 0
        self.filled = 0
        self.sealed = False
        self.running: Future[None] | None = None
        self.digest: str | None = None


def _hash_pieces(chunk: _Chunk, pieces: list[memoryview], final: bool) -> None:
    for piece in pieces:
        chunk.sha.update(piece)
    if final:
        chunk.digest = chunk.sha.hexdigest()


class ChunkHasher:
    """The sha256 of each `chunk_bytes` piece of a stream that is fed in order.

    A chunk starts hashing on `hash_pool` as soon as all of its bytes were added, so
    distinct chunks hash at once; one chunk's bytes are hashed in order, by one job at a
    time. Bytes passed to `add` are read by the pool later: keep them unchanged until
    `settle` or `finish` returns. With `expected` digests, `mismatch()` names the first
    chunk that differs among those hashed so far."""

    _OPEN_CHUNK_STEP: Final = 4 * CHUNK_BYTES
    """An open chunk hands what it has to a job every this many bytes (only matters for
    chunks much larger than that: whole-file digests of version 1 manifests)."""

    def __init__(
        self, chunk_bytes: int = HASH_CHUNK_BYTES, expected: Sequence[str] | None = None
    ) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be > 0, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.position = 0
        self._expected = expected
        self._chunks: list[_Chunk] = []
        self._futures: deque[Future[None]] = deque()
        self._max_jobs = 2 * hash_workers()
        self._checked = 0
        self._mismatch: tuple[int, str, str] | None = None
        self._finished = False

    def add(self, data: BytesLike) -> None:
        """Append the next bytes; every chunk they complete starts hashing."""
        if self._finished:
            raise ValueError("add after finish")
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            if not self._chunks or self._chunks[-1].filled == self.chunk_bytes:
                self._chunks.append(_Chunk())
            chunk = self._chunks[-1]
            take = min(len(view) - done, self.chunk_bytes - chunk.filled)
            chunk.pending.append(view[done : done + take])
            chunk.pending_bytes += take
            chunk.filled += take
            done += take
            if chunk.filled == self.chunk_bytes:
                self._start(chunk, final=True)
            elif chunk.pending_bytes >= self._OPEN_CHUNK_STEP:
                self._start(chunk, final=False)
        self.position += len(view)

    def settle(self) -> None:
        """Hash everything added so far (the open chunk too) and wait: afterwards the
        caller may change the buffers it added."""
        if self._chunks and self._chunks[-1].pending:
            self._start(self._chunks[-1], final=False)
        self.wait()

    def _start(self, chunk: _Chunk, final: bool) -> None:
        pieces, chunk.pending, size = chunk.pending, [], chunk.pending_bytes
        chunk.pending_bytes = 0
        chunk.sealed = final
        if chunk.running is not None:
            running, chunk.running = chunk.running, None
            running.result()  # this chunk's earlier bytes first
        if size < _INLINE_BYTES:
            _hash_pieces(chunk, pieces, final)
        else:
            chunk.running = hash_pool().submit(_hash_pieces, chunk, pieces, final)
            self._futures.append(chunk.running)
            while len(self._futures) > self._max_jobs:  # bounded lead over the hashing
                self._futures[0].result()
                self._futures.popleft()

    def wait(self) -> None:
        """Wait for every hashing job started so far (re-raising what one raised)."""
        while self._futures:
            self._futures[0].result()
            self._futures.popleft()

    def finish(self) -> tuple[str, ...]:
        """Close the last chunk (an empty stream has one empty chunk), wait, and return the
        hex digests of all chunks."""
        if not self._finished:
            self._finished = True
            if not self._chunks:
                self._chunks.append(_Chunk())
            last = self._chunks[-1]
            if not last.sealed:
                self._start(last, final=True)
        self.wait()
        return tuple(c.digest or "" for c in self._chunks)

    def mismatch(self) -> tuple[int, str, str] | None:
        """(chunk index, expected, actual) of the first chunk that differs from `expected`,
        among the chunks hashed so far in order; None if none (or without `expected`)."""
        if self._expected is None or self._mismatch is not None:
            return self._mismatch
        while self._checked < len(self._chunks):
            digest = self._chunks[self._checked].digest
            if digest is None:
                break
            index = self._checked
            want = self._expected[index] if index < len(self._expected) else ""
            if digest != want:
                self._mismatch = (index, want, digest)
                break
            self._checked += 1
        return self._mismatch

    def close(self) -> None:
        """Stop: drop the jobs not started and wait for the running ones (they read the
        caller's buffers, which may be freed once this returns)."""
        futures, self._futures = self._futures, deque()
        for future in futures:
            future.cancel()
        for future in futures:
            if not future.cancelled():
                with suppress(BaseException):  # closing after a failure: the first error stands
                    future.result()


class Flusher:
    """Makes a local file durable without a long stall at the end: every
    FLUSH_EVERY_BYTES it starts an `fdatasync` on a helper thread (skipped while one is
    still running), so the disk writes while the caller goes on; `close` does the final
    `fsync`. Without it, all the disk time would come after all the hashing."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._fd = raw.fileno()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fdatasync")
        self._running: Future[None] | None = None
        self._since = 0

    def wrote(self, n: int) -> None:
        self._since += n
        if self._since >= FLUSH_EVERY_BYTES and (self._running is None or self._running.done()):
            if self._running is not None:
                self._running.result()
            self._raw.flush()
            self._running = self._pool.submit(os.fdatasync, self._fd)
            self._since = 0

    def close(self) -> None:
        try:
            if self._running is not None:
                self._running.result()
            self._raw.flush()
            os.fsync(self._fd)
        finally:
            self._pool.shutdown(wait=True)


_DIRECT_ALIGN: Final = 4096
"""Offsets, lengths and buffer addresses of direct writes are multiples of this (the
logical block size of every common device divides it)."""


class DirectFile:
    """A new local file written with O_DIRECT, for writes that must reach the disk anyway
    (durable checkpoints): the bytes go from an aligned buffer to the device without
    filling the page cache, which saves the kernel's copy and page allocation (a CPU the
    hashing then has), and leaves no dirty pages for the final fsync to wait on or for
    write-back throttling to stall other writers on. `close` writes the unaligned tail
    through the page cache and fsyncs. `open` returns None where O_DIRECT is refused
    (tmpfs, some network filesystems); a write the device refuses (EINVAL) carries on
    through the page cache."""

    def __init__(self, fd: int, buffer_bytes: int = CHUNK_BYTES) -> None:
        self._fd = fd
        self._buf = mmap.mmap(-1, buffer_bytes)  # page-aligned
        self._view = memoryview(self._buf)
        self._filled = 0
        self._direct = True
        self.closed = False

    @classmethod
    def open(cls, path: str, *, buffer_bytes: int = CHUNK_BYTES) -> DirectFile | None:
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | flag, 0o666)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise
        return cls(fd, buffer_bytes)

    def fileno(self) -> int:
        return self._fd

    def write(self, data: BytesLike) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            take = min(len(view) - done, len(self._view) - self._filled)
            self._view[self._filled : self._filled + take] = view[done : done + take]
            self._filled += take
            done += take
            if self._filled == len(self._view):
                self._drain()
        return len(view)

    def _drain(self) -> None:
        """Write the whole buffer, or all but an unaligned tail while direct."""
        end = self._filled - self._filled % _DIRECT_ALIGN if self._direct else self._filled
        done = 0
        while done < end:
            try:
                n = os.write(self._fd, self._view[done:end])
            except OSError as exc:
                if not self._direct or exc.errno != errno.EINVAL:
                    raise
                self._buffered()
                end = self._filled
                continue
            done += n
            if n % _DIRECT_ALIGN and self._direct:  # a short, unaligned write: the offset
                self._buffered()  # no longer suits O_DIRECT
                end = self._filled
        rest = self._filled - done
        self._view[:rest] = self._view[done : self._filled]
        self._filled = rest

    def _buffered(self) -> None:
        import fcntl

        flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
        fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        self._direct = False

    def flush(self) -> None:
        """Write everything buffered (after an unaligned tail, through the page cache)."""
        self._drain()
        if self._filled:
            self._buffered()
            self._drain()

    def close(self, *, abort: bool = False) -> None:
        """Flush, fsync and close; with `abort` (the writer failed: the file is thrown
        away) only close. The fd is closed even if flushing fails."""
        if self.closed:
            return
        self.closed = True
        try:
            if not abort:
                self.flush()
                os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._view.release()
            self._buf.close()

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(abort=kind is not None)


class FileWriter:
    """What a `WriteFn` hands out: a write-only binary file that counts and hashes.

    `write` accepts any buffer (bytes, bytearray, memoryview of tensor memory) and hashes
    it on the pool while writing it; `write_stable` does the same without waiting for the
    hashes, for buffers that stay unchanged until the file is closed."""

    def __init__(
        self,
        raw: IO[bytes] | DirectFile,
        name: str,
        *,
        durable: bool = False,
        chunk_bytes: int = HASH_CHUNK_BYTES,
    ) -> None:
        self._raw = raw
        self.name = name
        self.size_bytes = 0
        self.chunk_bytes = chunk_bytes
        self._hasher = ChunkHasher(chunk_bytes)
        # a DirectFile writes to the disk as it goes and fsyncs when closed
        self._flusher = Flusher(raw) if durable and not isinstance(raw, DirectFile) else None
        self._digests: tuple[str, ...] | None = None
        self.closed = False

    def write(self, data: BytesLike) -> int:
        """Write and hash `data`; the caller may reuse it once this returns."""
        return self._write(data, stable=False)

    def write_stable(self, data: BytesLike) -> int:
        """Write `data`, which must stay unchanged until `close`: its hashing may still be
        running when this returns."""
        return self._write(data, stable=True)

    def _write(self, data: BytesLike, *, stable: bool) -> int:
        if self.closed:
            raise ValueError(f"write to the closed checkpoint file {self.name}")
        view = memoryview(data).cast("B")
        n = len(view)
        self._hasher.add(view)  # the chunks it completes hash while they are written below
        try:
            for start in range(0, n, CHUNK_BYTES):
                chunk = view[start : start + CHUNK_BYTES]
                _write_all(self._raw, chunk)
                if self._flusher is not None:
                    self._flusher.wrote(len(chunk))
        finally:
            if not stable:
                self._hasher.settle()  # the caller may reuse `data` once we return
        self.size_bytes += n
        return n

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._raw.flush()

    def digests(self) -> tuple[str, ...]:
        """The sha256 of each chunk (after `close`)."""
        if self._digests is None:
            raise ValueError(f"checkpoint file {self.name}: digests before close")
        return self._digests

    def close(self) -> None:
        """Finish hashing and, when durable, fsync (the file itself is the caller's)."""
        if not self.closed:
            self.closed = True
            try:
                self._digests = self._hasher.finish()
            finally:
                self._hasher.close()
                if self._flusher is not None:
                    self._flusher.close()


def _write_all(raw: IO[bytes] | DirectFile, chunk: memoryview) -> None:
    done = 0
    while done < len(chunk):
        n = raw.write(chunk[done:])
        if n is None:  # some file objects return None after writing everything
            return
        done += n


class CheckpointReader:
    """A read-only binary file of a checkpoint that checks size and chunk digests as it
    is read.

    When `verify` is true, `finish()` reads whatever is left, waits for the hashing, then
    raises `CorruptCheckpoint` if the size or the sha256 of a chunk differs from the
    manifest; the store's `open_file` context manager calls it on a normal exit. A file
    longer than the manifest says, or a chunk that differs, is reported as soon as it is
    noticed."""

    def __init__(
        self,
        raw: IO[bytes],
        *,
        uri: str,
        name: str,
        size_bytes: int,
        sha256: Sequence[str],
        verify: bool,
        chunk_bytes: int = HASH_CHUNK_BYTES,
    ) -> None:
        self._raw = raw
        self._uri = uri
        self.name = name
        self.expected_size = size_bytes
        self._verify = verify
        self._chunk_bytes = chunk_bytes
        self._hasher = ChunkHasher(chunk_bytes, expected=sha256) if verify else None
        self.position = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(self.expected_size - self.position, 0) + 1  # +1 notices trailing bytes
            data = self._raw.read(n)
            more = self._raw.read(CHUNK_BYTES) if data else b""
            if more:  # a file longer than the manifest (or a short read): keep counting
                chunks = [data, more]
                while more:
                    more = self._raw.read(CHUNK_BYTES)
                    chunks.append(more)
                data = b"".join(chunks)  # no second copy of the whole file otherwise
        else:
            data = self._raw.read(n)
        self._account(memoryview(data))  # bytes never change: hashing may go on
        return data

    def readinto(self, buffer: BytesLike) -> int:
        """Fill `buffer` (fewer bytes only at the end of the file), hashing each chunk while
        the next one is read; the caller may reuse `buffer` once this returns."""
        filled = self._readinto(buffer)
        if self._hasher is not None:
            self._hasher.settle()
            self._check()
        return filled

    def readinto_stable(self, buffer: BytesLike) -> int:
        """`readinto` for a buffer that stays unchanged until `finish`: returns without
        waiting for the hashing, which goes on while the caller reads on."""
        return self._readinto(buffer)

    def _readinto(self, buffer: BytesLike) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            # up to the next chunk boundary: that chunk can start hashing right after
            step = min(len(view) - filled, self._to_boundary())
            segment = view[filled : filled + step]
            got = 0
            while got < len(segment):
                n = self._raw.readinto(segment[got:])  # type: ignore[attr-defined]
                if not n:
                    break
                got += n
            self._account(segment[:got])
            filled += got
            if got < len(segment):
                break
        return filled

    def _to_boundary(self) -> int:
        return self._chunk_bytes - self.position % self._chunk_bytes

    def _account(self, data: memoryview) -> None:
        self.position += len(data)
        if self.position > self.expected_size and self._verify:
            raise CorruptCheckpoint(
                self._uri,
                self.name,
                f"size differs (manifest {self.expected_size} bytes, file is longer)",
            )
        if self._hasher is not None and len(data):
            self._hasher.add(data)
            self._check()

    def _check(self) -> None:
        assert self._hasher is not None
        bad = self._hasher.mismatch()
        if bad is not None:
            index, want, got = bad
            start = index * self._chunk_bytes
            end = min(start + self._chunk_bytes, self.expected_size)
            raise chunk_differs(self._uri, self.name, index, start, end, want, got)

    def finish(self) -> None:
        """Read to the end and check size and digests (no-op when not verifying)."""
        if not self._verify or self._hasher is None:
            return
        self._hasher.settle()  # the rest is read into a scratch buffer, reused below
        left = self.expected_size - self.position
        scratch = bytearray(min(max(left, 0), CHUNK_BYTES) or 1)
        while True:
            n = self._readinto(scratch)
            self._hasher.settle()
            if n < len(scratch):
                break
        if self.position != self.expected_size:
            raise CorruptCheckpoint(
                self._uri,
                self.name,
                f"size differs (manifest {self.expected_size} bytes, file {self.position})",
            )
        self._hasher.finish()
        self._check()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                if self._hasher is not None:
                    self._hasher.close()
            finally:
                self._raw.close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
