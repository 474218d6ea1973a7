"""File wrappers that sha256 the bytes passing through them, overlapping hashing with I/O.

`hashlib` releases the GIL on large buffers, and so does file I/O, so hashing on a helper
thread while the caller's thread reads or writes costs about max(hash, I/O) instead of
their sum. Both wrappers keep the contract of ordinary files: when `write` or `readinto`
returns, the caller may reuse its buffer.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Final, TypeAlias

from orchestrator.checkpoints.errors import CorruptCheckpoint

BytesLike: TypeAlias = bytes | bytearray | memoryview

CHUNK_BYTES: Final = 8 << 20
"""Granularity of pipelined hashing and of streamed copies."""
_INLINE_BYTES: Final = 1 << 20
"""Below this, hash on the caller's thread: a hand-off costs more than it saves."""
FLUSH_EVERY_BYTES: Final = 64 << 20
"""Write-behind granularity of durable local writes."""


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


class _Hasher:
    """sha256 whose updates may run on one helper thread, strictly in submission order."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future[None] | None = None

    def update(self, data: memoryview) -> None:
        """Hash `data` now (small) or on the helper; call `wait` before the buffer changes."""
        if len(data) < _INLINE_BYTES:
            self.wait()
            self._sha.update(data)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._last = self._pool.submit(self._sha.update, data)

    def wait(self) -> None:
        if self._last is not None:
            last, self._last = self._last, None
            last.result()

    def hexdigest(self) -> str:
        self.wait()
        return self._sha.hexdigest()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


class FileWriter:
    """What a `WriteFn` hands out: a write-only binary file that counts and hashes.

    `write` accepts any buffer (bytes, bytearray, memoryview of tensor memory); large
    buffers are written in chunks while the previous chunk is hashed."""

    def __init__(self, raw: IO[bytes], name: str, *, durable: bool = False) -> None:
        self._raw = raw
        self.name = name
        self.size_bytes = 0
        self._hasher = _Hasher()
        self._flusher = Flusher(raw) if durable else None
        self.closed = False

    def write(self, data: BytesLike) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        for start in range(0, n, CHUNK_BYTES):
            chunk = view[start : start + CHUNK_BYTES]
            self._hasher.update(chunk)  # hashes while the chunk is written below
            _write_all(self._raw, chunk)
            if self._flusher is not None:
                self._flusher.wrote(len(chunk))
        self._hasher.wait()  # the caller may reuse `data` once we return
        self.size_bytes += n
        return n

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        self._raw.flush()

    def sha256(self) -> str:
        return self._hasher.hexdigest()

    def close(self) -> None:
        """Finish hashing and, when durable, fsync (the file itself is the caller's)."""
        if not self.closed:
            self.closed = True
            try:
                self._hasher.close()
            finally:
                if self._flusher is not None:
                    self._flusher.close()


def _write_all(raw: IO[bytes], chunk: memoryview) -> None:
    done = 0
    while done < len(chunk):
        n = raw.write(chunk[done:])
        if n is None:  # some file objects return None after writing everything
            return
        done += n


class CheckpointReader:
    """A read-only binary file of a checkpoint that checks size and sha256 as it is read.

    When `verify` is true, `finish()` reads whatever is left, then raises `CorruptCheckpoint`
    if the size or the sha256 differs from the manifest; the store's `open_file` context
    manager calls it on a normal exit. A file longer or shorter than the manifest says is
    reported as soon as it is noticed."""

    def __init__(
        self, raw: IO[bytes], *, uri: str, name: str, size_bytes: int, sha256: str, verify: bool
    ) -> None:
        self._raw = raw
        self._uri = uri
        self.name = name
        self.expected_size = size_bytes
        self._expected_sha = sha256
        self._verify = verify
        self._hasher = _Hasher() if verify else None
        self.position = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(self.expected_size - self.position, 0) + 1  # +1 notices trailing bytes
            data = self._raw.read(n)
            chunks = [data]
            while data:  # a file longer than the manifest: keep counting
                data = self._raw.read(CHUNK_BYTES)
                chunks.append(data)
            data = b"".join(chunks)
        else:
            data = self._raw.read(n)
        self._account(memoryview(data))
        if self._hasher is not None:
            self._hasher.wait()
        return data

    def readinto(self, buffer: BytesLike) -> int:
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            chunk = view[filled : filled + CHUNK_BYTES]
            got = 0
            while got < len(chunk):
                n = self._raw.readinto(chunk[got:])  # type: ignore[attr-defined]
                if not n:
                    break
                got += n
            self._account(chunk[:got])  # hashed on the helper while the next chunk is read
            filled += got
            if got < len(chunk):
                break
        if self._hasher is not None:
            self._hasher.wait()
        return filled

    def _account(self, data: memoryview) -> None:
        self.position += len(data)
        if self.position > self.expected_size and self._verify:
            raise CorruptCheckpoint(
                self._uri, self.name,
                f"size differs (manifest {self.expected_size} bytes, file is longer)",
            )
        if self._hasher is not None and len(data):
            self._hasher.update(data)

    def finish(self) -> None:
        """Read to the end and check size and sha256 (no-op when not verifying)."""
        if not self._verify or self._hasher is None:
            return
        buffers = (bytearray(CHUNK_BYTES), bytearray(CHUNK_BYTES))
        i = 0
        while True:
            # double buffering: hash one buffer while reading into the other
            n = self.readinto_nowait(buffers[i])
            if n == 0:
                break
            i ^= 1
        self._hasher.wait()
        if self.position != self.expected_size:
            raise CorruptCheckpoint(
                self._uri, self.name,
                f"size differs (manifest {self.expected_size} bytes, file {self.position})",
            )
        actual = self._hasher.hexdigest()
        if actual != self._expected_sha:
            raise CorruptCheckpoint(
                self._uri, self.name,
                f"sha256 differs (manifest {self._expected_sha[:16]}…, read {actual[:16]}…)",
            )

    def readinto_nowait(self, buffer: bytearray) -> int:
        # waits for the hash of the buffer read before the previous one (double buffering)
        assert self._hasher is not None
        view = memoryview(buffer)
        got = 0
        while got < len(view):
            n = self._raw.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                break
            got += n
        self._hasher.wait()
        self._account(view[:got])
        return got

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
