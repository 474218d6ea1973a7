"""A checkpoint store over any fsspec filesystem (file://, memory://, s3://, gs://, ...).

Layout under the root::

    <root>/<job_id>/step-<step:012d>/<files...>      the checkpoint's files
    <root>/<job_id>/step-<step:012d>/manifest.json   sizes + chunk sha256s of every file; last
    <root>/<job_id>/.requests/<sha256(request_id)>.json   copies already done, by request id

Invariants:

- A checkpoint is *published* when its manifest exists. The manifest is written under a
  temporary dot-name and renamed into place after every file is complete, so a crash at
  any point leaves either nothing visible or a whole checkpoint. Directories without a
  manifest are invisible to `list`/`latest` and are swept by `retain`.
- A published checkpoint is never rewritten in place: `write` refuses a step that is
  already published (`CheckpointExists`). Deletion removes the manifest first.
- Every byte is covered by a sha256 in the manifest: one per 16 MiB chunk of each file
  (`manifest`), so hashing and verification use every core. Reads check what they read
  before handing it over as good (`open_file`, `read`; `orchestrator.training` loads
  through them).
- `verify` re-reads every byte; `latest` returns the newest checkpoint that verifies and
  falls back (with a warning) past corrupt ones; `retain` never deletes the newest
  checkpoint that verifies, nor a pinned one.
- `copy` never writes to the source; it carries the manifest byte for byte, so the copy has
  the same `manifest_sha256`; it verifies the destination before returning and is
  idempotent by request id.

Durability on local filesystems (`durable=True`, the default): every file is fsynced
(written with O_DIRECT where the filesystem allows, `hashio.DirectFile`, else with
write-behind, `hashio.Flusher`) before the manifest is published, and the
manifest and its directory after, so a power loss cannot leave a published checkpoint
whose bytes are not on disk. Object stores (s3, gs) make a PUT durable by themselves.
Whatever happens, `verify` re-reads every byte and `latest` falls back past a corrupt
checkpoint. One writer per job at a time is the caller's job (the orchestrator runs one
instance per job).

Verification stamps (local filesystems, `stamps=True`, the default; see `stamps`): when a
checkpoint's hashes are known good (it was just written and published, or `verify` re-read
it), the store notes each file's `stat`; a verifying read of a file whose `stat` has not
changed since, on the same machine and boot, skips the re-hash. `verify`, `latest`,
`retain` and copies never rely on a stamp.

Backends other than file:// and memory:// (s3fs, gcsfs, ...) are imported by fsspec only
when a store with that protocol is created.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import math
import os
import queue
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass
from typing import IO, Any, Final, TypeAlias

import fsspec
from fsspec.implementations.local import LocalFileSystem

from orchestrator.checkpoints import manifest as mf
from orchestrator.checkpoints import stamps as st
from orchestrator.checkpoints.errors import CheckpointExists, CorruptCheckpoint
from orchestrator.checkpoints.hashio import (
    CHUNK_BYTES,
    CheckpointReader,
    ChunkHasher,
    DirectFile,
    FileWriter,
    Flusher,
    chunk_differs,
    hash_pool,
)
from orchestrator.errors import InputError, PermanentError

logger = logging.getLogger(__name__)

REQUESTS_DIR: Final = ".requests"

WriteFn: TypeAlias = Callable[[str], AbstractContextManager[FileWriter]]
"""`write_fn(name)` opens the checkpoint file `name` for writing: ``with write_fn("a.bin") as f:
f.write(data)``. Each name may be opened once; several may be open at once, in several
threads. `f.write_stable(data)` is faster for buffers left unchanged until the block ends."""
Progress: TypeAlias = Callable[[int, int], None]
"""`progress(bytes_done, bytes_total)`, called after every chunk of a copy."""


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A published checkpoint. `uri` is its directory; `manifest_sha256` its identity (the
    same in every store it was copied to); `size_bytes` the sum of its files."""

    uri: str
    job_id: str
    step: int
    created_at_s: float
    size_bytes: int
    manifest_sha256: str


def step_dir_name(step: int) -> str:
    return f"step-{step:012d}"


def _normalize_root(root_uri: str) -> str:
    if not isinstance(root_uri, str) or not root_uri.strip():
        raise InputError(
            "checkpoint store",
            "root_uri",
            "a URI such as file:///data/ckpt, memory://bucket/prefix or s3://bucket/prefix",
            got=repr(root_uri),
        )
    uri = root_uri.strip()
    if "://" not in uri:
        uri = "file://" + os.path.abspath(os.path.expanduser(uri))
    stripped = uri.rstrip("/")
    return uri if stripped.endswith(":") else stripped  # "memory://" stays as it is


class CheckpointStore:
    """Checkpoints of many jobs under one root URI. Thread-safe for distinct jobs.

    `storage_options` go to fsspec (credentials, endpoint_url, ...). `durable=False` skips
    the fsyncs on local filesystems (scratch stores, tests). `chunk_bytes` is the size of
    the pieces that get one sha256 each in the manifests this store writes (reading takes
    whatever a manifest says). `stamps=False` makes every read re-hash what it reads, even
    files unchanged since they were verified (and records no stamps)."""

    def __init__(
        self,
        root_uri: str,
        *,
        durable: bool = True,
        chunk_bytes: int = mf.CHUNK_BYTES,
        stamps: bool = True,
        **storage_options: Any,
    ) -> None:
        if (
            not isinstance(chunk_bytes, int)
            or isinstance(chunk_bytes, bool)
            or not 0 < chunk_bytes <= mf.MAX_CHUNK_BYTES
        ):
            raise InputError(
                "checkpoint store",
                "chunk_bytes",
                f"an integer in [1, {mf.MAX_CHUNK_BYTES}]",
                got=repr(chunk_bytes),
            )
        self.chunk_bytes = chunk_bytes
        self.root_uri = _normalize_root(root_uri)
        protocol = self.root_uri.split("://", 1)[0]
        try:
            fs, path = fsspec.core.url_to_fs(self.root_uri, **storage_options)
        except ImportError as exc:
            raise PermanentError(
                f"checkpoint store {self.root_uri}: the fsspec backend for {protocol}:// is not "
                f"installed ({exc}); install it (s3fs for s3://, gcsfs for gs://)"
            ) from exc
        except (ValueError, TypeError) as exc:
            raise InputError(
                "checkpoint store",
                "root_uri",
                "a URI fsspec understands",
                got=f"{root_uri!r} ({exc})",
            ) from exc
        self._fs: fsspec.AbstractFileSystem = fs
        self._root: str = str(path).rstrip("/") or str(path)
        self._fsync = durable and isinstance(fs, LocalFileSystem)
        self._stamps = stamps and isinstance(fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"CheckpointStore({self.root_uri!r})"

    # -- paths --------------------------------------------------------------------------

    def _job_path(self, job_id: str) -> str:
        return f"{self._root}/{job_id}"

    def _dir_path(self, job_id: str, step: int) -> str:
        return f"{self._root}/{job_id}/{step_dir_name(step)}"

    def _dir_uri(self, job_id: str, step: int) -> str:
        return f"{self.root_uri}/{job_id}/{step_dir_name(step)}"

    def _ref_dir(self, ref: CheckpointRef) -> str:
        mf.check_job_id(ref.job_id)
        mf.check_step(ref.step)
        if ref.uri != self._dir_uri(ref.job_id, ref.step):
            raise InputError(
                repr(self),
                "ref.uri",
                f"a checkpoint of this store ({self._dir_uri(ref.job_id, ref.step)})",
                got=ref.uri,
                fix="use the store the reference came from",
            )
        return self._dir_path(ref.job_id, ref.step)

    # -- write --------------------------------------------------------------------------

    def write(
        self,
        job_id: str,
        step: int,
        files: Mapping[str, bytes] | Callable[[WriteFn], None],
        *,
        now_s: float,
        metadata: Mapping[str, str] | None = None,
    ) -> CheckpointRef:
        """Write the files of one checkpoint, then publish its manifest (atomically).

        `files` is either a mapping of names to bytes or a function that receives a
        `WriteFn` and streams the files through it. Raises `CheckpointExists` if the step
        is already published. On any error the unpublished files are removed (best effort)
        and nothing becomes visible."""
        mf.check_job_id(job_id)
        mf.check_step(step)
        self._check_now(now_s)
        meta = mf.as_str_dict(metadata)
        directory = self._open_unpublished(job_id, step)
        entries: dict[str, mf.FileEntry] = {}
        try:
            if callable(files):
                files(self._write_fn(directory, entries))
            else:
                write_fn = self._write_fn(directory, entries)
                for name, data in files.items():
                    with write_fn(name) as out:
                        out.write(data)
            return self._publish_entries(job_id, step, directory, entries, now_s, meta)
        except BaseException:
            self._discard_unpublished(directory)
            raise

    def write_part(
        self, job_id: str, step: int, files: Callable[[WriteFn], None]
    ) -> dict[str, mf.FileEntry]:
        """Write some of the files of a checkpoint that several processes write together
        (ranks of a distributed job, each with names of its own), and return their manifest
        entries; nothing becomes visible until one process calls `publish` with the entries
        of every part. Raises `CheckpointExists` if the step is already published. On an
        error the files already written stay until `discard_unpublished` or `retain`."""
        mf.check_job_id(job_id)
        mf.check_step(step)
        entries: dict[str, mf.FileEntry] = {}
        files(self._write_fn(self._open_unpublished(job_id, step), entries))
        return entries

    def publish(
        self,
        job_id: str,
        step: int,
        entries: Mapping[str, mf.FileEntry],
        *,
        now_s: float,
        metadata: Mapping[str, str] | None = None,
    ) -> CheckpointRef:
        """Publish the checkpoint whose files were written by `write_part` calls (in any
        processes): check that every listed file is there at its listed size, then write the
        manifest, atomically. Files of the directory that `entries` does not list are left
        out of the checkpoint. Raises `CheckpointExists` if the step is already published
        and CorruptCheckpoint (publishing nothing) if a listed file is missing or of
        another size."""
        mf.check_job_id(job_id)
        mf.check_step(step)
        self._check_now(now_s)
        meta = mf.as_str_dict(metadata)
        directory = self._dir_path(job_id, step)
        uri = self._dir_uri(job_id, step)
        if self._fs.exists(f"{directory}/{mf.MANIFEST_NAME}"):
            raise self._exists(job_id, step)
        for name, entry in sorted(entries.items()):
            mf.check_file_name(name)
            try:
                size = self._fs.size(f"{directory}/{name}")
            except FileNotFoundError as exc:
                raise CorruptCheckpoint(uri, name, "missing: its part was not written") from exc
            if size != entry.size_bytes:
                raise CorruptCheckpoint(
                    uri, name, f"size differs (part wrote {entry.size_bytes} bytes, file {size})"
                )
        return self._publish_entries(job_id, step, directory, dict(entries), now_s, meta)

    def discard_unpublished(self, job_id: str, step: int) -> None:
        """Remove the files of an unpublished checkpoint (best effort; a published one is
        left alone): what a failed multi-process write leaves behind."""
        mf.check_job_id(job_id)
        mf.check_step(step)
        self._discard_unpublished(self._dir_path(job_id, step))

    @staticmethod
    def _check_now(now_s: float) -> None:
        if not isinstance(now_s, int | float) or not math.isfinite(now_s):
            raise InputError(
                "checkpoint store", "now_s", "a finite time in seconds", got=repr(now_s)
            )

    def _exists(self, job_id: str, step: int) -> CheckpointExists:
        return CheckpointExists(
            f"{self._dir_uri(job_id, step)}: a checkpoint of job {job_id} at step {step} is "
            "already published; a published checkpoint is never rewritten"
        )

    def _open_unpublished(self, job_id: str, step: int) -> str:
        """The directory of a checkpoint about to be written (made if need be)."""
        directory = self._dir_path(job_id, step)
        if self._fs.exists(f"{directory}/{mf.MANIFEST_NAME}"):
            raise self._exists(job_id, step)
        self._fs.makedirs(directory, exist_ok=True)
        return directory

    def _write_fn(self, directory: str, entries: dict[str, mf.FileEntry]) -> WriteFn:
        lock = threading.Lock()

        @contextmanager
        def write_fn(name: str) -> Iterator[FileWriter]:
            mf.check_file_name(name)
            with lock:
                if name in entries:
                    raise InputError(
                        "checkpoint store", "file name", "each name written once", got=repr(name)
                    )
            path = f"{directory}/{name}"
            if "/" in name:
                self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            with self._create(path) as raw:
                writer = FileWriter(raw, name, durable=self._fsync, chunk_bytes=self.chunk_bytes)
                try:
                    yield writer
                finally:
                    writer.close()
            with lock:
                entries[name] = mf.FileEntry(
                    writer.size_bytes, writer.chunk_bytes, writer.digests()
                )

        return write_fn

    def _create(self, path: str) -> AbstractContextManager[IO[bytes] | DirectFile]:
        """A new file to write: durable local ones with direct I/O where the filesystem
        allows it (`DirectFile`: fsynced when closed), others through fsspec."""
        direct = DirectFile.open(path) if self._fsync else None
        return direct if direct is not None else self._fs.open(path, "wb")

    def _publish_entries(
        self,
        job_id: str,
        step: int,
        directory: str,
        entries: dict[str, mf.FileEntry],
        now_s: float,
        meta: dict[str, str],
    ) -> CheckpointRef:
        if not entries:
            raise InputError("checkpoint store", "files", "at least one file", got="none")
        manifest = mf.Manifest(job_id, step, float(now_s), entries, meta)
        blob = manifest.encode()
        self._publish(directory, blob)
        if self._stamps:  # hashed as written, sizes checked: good as they are now
            now = st.stat_files(directory, entries)
            st.record(
                directory,
                mf.sha256_hex(blob),
                {n: s for n, s in now.items() if s.size_bytes == entries[n].size_bytes},
            )
        ref = CheckpointRef(
            uri=self._dir_uri(job_id, step),
            job_id=job_id,
            step=step,
            created_at_s=manifest.created_at_s,
            size_bytes=manifest.size_bytes,
            manifest_sha256=mf.sha256_hex(blob),
        )
        logger.info("checkpoint published: %s (%d bytes)", ref.uri, ref.size_bytes)
        return ref

    def _publish(self, directory: str, blob: bytes) -> None:
        tmp = f"{directory}/.{mf.MANIFEST_NAME}.{uuid.uuid4().hex}.tmp"
        self._fs.pipe_file(tmp, blob)
        self._sync_path(tmp)
        self._fs.mv(tmp, f"{directory}/{mf.MANIFEST_NAME}")
        self._sync_path(directory)  # the rename
        self._sync_path(directory.rsplit("/", 1)[0])  # the step directory's entry

    def _sync_path(self, path: str) -> None:
        """fsync a local file or directory (no-op unless durable and local)."""
        if not self._fsync:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _discard_unpublished(self, directory: str) -> None:
        try:
            if not self._fs.exists(f"{directory}/{mf.MANIFEST_NAME}") and self._fs.exists(
                directory
            ):
                self._fs.rm(directory, recursive=True)
        except Exception:  # best effort: retain() sweeps what is left
            logger.warning(
                "could not remove the unpublished checkpoint %s", directory, exc_info=True
            )

    # -- read ---------------------------------------------------------------------------

    def list(self, job_id: str) -> builtins.list[CheckpointRef]:
        """Published checkpoints of `job_id`, oldest first. Manifests that cannot be parsed
        are skipped with a warning (they cannot verify)."""
        mf.check_job_id(job_id)
        paths = sorted(self._fs.glob(f"{self._job_path(job_id)}/step-*/{mf.MANIFEST_NAME}"))
        if not paths:
            return []
        blobs = self._fs.cat(paths, on_error="return")
        if not isinstance(blobs, dict):  # a single path comes back as bytes
            blobs = {paths[0]: blobs}
        refs: builtins.list[CheckpointRef] = []
        for path in paths:
            blob = blobs.get(path)
            dir_name = path.rstrip("/").rsplit("/", 2)[-2]
            if isinstance(blob, FileNotFoundError):
                continue  # deleted since the listing
            if not isinstance(blob, bytes):
                logger.warning(
                    "cannot read the manifest of %s/%s/%s: %r",
                    self.root_uri,
                    job_id,
                    dir_name,
                    blob,
                )
                continue
            try:
                m = mf.decode(blob)
            except ValueError as exc:
                logger.warning(
                    "skipping %s/%s/%s: unreadable manifest (%s)",
                    self.root_uri,
                    job_id,
                    dir_name,
                    exc,
                )
                continue
            if m.job_id != job_id or step_dir_name(m.step) != dir_name:
                logger.warning(
                    "skipping %s/%s/%s: its manifest is for job %s step %d",
                    self.root_uri,
                    job_id,
                    dir_name,
                    m.job_id,
                    m.step,
                )
                continue
            refs.append(self._ref_from(m, blob))
        refs.sort(key=lambda r: r.step)
        return refs

    def _ref_from(self, m: mf.Manifest, blob: bytes) -> CheckpointRef:
        return CheckpointRef(
            uri=self._dir_uri(m.job_id, m.step),
            job_id=m.job_id,
            step=m.step,
            created_at_s=m.created_at_s,
            size_bytes=m.size_bytes,
            manifest_sha256=mf.sha256_hex(blob),
        )

    def latest(self, job_id: str, *, verify: bool = True) -> CheckpointRef | None:
        """The newest checkpoint that verifies (each corrupt newer one is logged and
        skipped), or None. `verify=False` returns the newest published one unchecked."""
        refs = self.list(job_id)
        if not verify:
            return refs[-1] if refs else None
        for ref in reversed(refs):
            try:
                self.verify(ref)
            except CorruptCheckpoint as exc:
                logger.warning(
                    "checkpoint %s is corrupt, falling back to the previous one: %s", ref.uri, exc
                )
                continue
            return ref
        return None

    def manifest(self, ref: CheckpointRef) -> mf.Manifest:
        """The manifest of `ref`; raises CorruptCheckpoint if it is gone or differs."""
        return self._read_manifest(ref)[0]

    def metadata(self, ref: CheckpointRef) -> Mapping[str, str]:
        return self.manifest(ref).metadata

    def _read_manifest(self, ref: CheckpointRef) -> tuple[mf.Manifest, bytes]:
        directory = self._ref_dir(ref)
        try:
            blob = self._fs.cat_file(f"{directory}/{mf.MANIFEST_NAME}")
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(
                ref.uri, mf.MANIFEST_NAME, "missing (deleted or never published)"
            ) from exc
        actual = mf.sha256_hex(blob)
        if actual != ref.manifest_sha256:
            raise CorruptCheckpoint(
                ref.uri,
                mf.MANIFEST_NAME,
                f"sha256 differs from the reference (ref {ref.manifest_sha256[:16]}…, "
                f"read {actual[:16]}…)",
            )
        try:
            m = mf.decode(blob)
        except ValueError as exc:  # same sha as the ref yet unreadable: the ref is bogus
            raise CorruptCheckpoint(ref.uri, mf.MANIFEST_NAME, f"unreadable ({exc})") from exc
        if m.job_id != ref.job_id or m.step != ref.step:
            raise CorruptCheckpoint(
                ref.uri, mf.MANIFEST_NAME, f"is for job {m.job_id} step {m.step}"
            )
        return m, blob

    def verify(self, ref: CheckpointRef) -> None:
        """Re-read every byte; raise CorruptCheckpoint naming what differs from the
        manifest: a missing file or a wrong size first (no reading needed), else the first
        chunk, in file-name order, whose sha256 differs. The chunks of all files are read
        and hashed at once, on every core."""
        m, _ = self._read_manifest(ref)
        directory = self._ref_dir(ref)
        names = sorted(m.files)
        before = st.stat_files(directory, names) if self._stamps else {}
        for name in names:  # the cheap checks first: every file there, at its size
            try:
                stamp = before.get(name)
                size = stamp.size_bytes if stamp else self._fs.size(f"{directory}/{name}")
            except FileNotFoundError as exc:
                raise CorruptCheckpoint(ref.uri, name, "missing") from exc
            if size != m.files[name].size_bytes:
                raise CorruptCheckpoint(
                    ref.uri,
                    name,
                    f"size differs (manifest {m.files[name].size_bytes} bytes, file {size})",
                )
        scratch = threading.local()  # one read buffer per pool thread, for this call
        jobs = [(name, index) for name in names for index in range(len(m.files[name].sha256))]
        pool = hash_pool()
        futures = [
            pool.submit(
                self._chunk_sha256,
                ref.uri,
                directory,
                name,
                m.files[name].chunk_range(index),
                scratch,
            )
            for name, index in jobs
        ]
        try:
            for (name, index), future in zip(jobs, futures, strict=True):
                entry = m.files[name]
                digest = future.result()
                if digest != entry.sha256[index]:
                    raise chunk_differs(
                        ref.uri, name, index, *entry.chunk_range(index), entry.sha256[index], digest
                    )
        finally:
            for future in futures:
                future.cancel()
        if self._stamps and st.stat_files(directory, names) == before:  # unchanged throughout
            st.record(directory, ref.manifest_sha256, before)

    def _chunk_sha256(
        self,
        uri: str,
        directory: str,
        name: str,
        span: tuple[int, int],
        scratch: threading.local,
    ) -> str:
        """sha256 of bytes [start, end) of one file (a job of `verify`). Local files are
        read into a buffer per pool thread; other filesystems get ranged reads
        (`cat_file`), which object stores serve in parallel and memory:// without sharing
        its one file object per path."""
        start, end = span
        path = f"{directory}/{name}"
        sha = hashlib.sha256()
        pos = start
        try:
            if isinstance(self._fs, LocalFileSystem):
                buf: bytearray | None = getattr(scratch, "buf", None)
                if buf is None or len(buf) < min(end - start, CHUNK_BYTES):
                    buf = scratch.buf = bytearray(min(max(end - start, 1), CHUNK_BYTES))
                view = memoryview(buf)
                with open(path, "rb", buffering=0) as f:
                    f.seek(start)
                    while pos < end:
                        part = view[: min(len(view), end - pos)]
                        n = f.readinto(part)
                        if not n:
                            break
                        sha.update(part[:n])
                        pos += n
            else:
                while pos < end:
                    data = self._fs.cat_file(path, start=pos, end=min(pos + CHUNK_BYTES, end))
                    if not data:
                        break
                    sha.update(data)
                    pos += len(data)
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(uri, name, "missing") from exc
        if pos < end:
            raise CorruptCheckpoint(uri, name, f"size differs (file ends at {pos})")
        return sha.hexdigest()

    def open_file(
        self, ref: CheckpointRef, name: str, *, verify: bool = True
    ) -> AbstractContextManager[CheckpointReader]:
        """Stream one file: ``with store.open_file(ref, "state") as f: f.readinto(buf)``.
        With `verify`, a normal exit from the block reads what is left and raises
        CorruptCheckpoint if the size or sha256 differs (an exception inside the block
        skips the check)."""
        m, _ = self._read_manifest(ref)
        return self._open_verified(ref, m, name, verify=verify)

    @contextmanager
    def _open_verified(
        self, ref: CheckpointRef, m: mf.Manifest, name: str, *, verify: bool
    ) -> Iterator[CheckpointReader]:
        entry = m.files.get(name)
        if entry is None:
            raise InputError(
                ref.uri, "file name", "one of " + ", ".join(sorted(m.files)), got=repr(name)
            )
        directory = self._ref_dir(ref)
        try:
            raw = self._fs.open(f"{directory}/{name}", "rb", block_size=CHUNK_BYTES)
        except FileNotFoundError as exc:
            raise CorruptCheckpoint(ref.uri, name, "missing") from exc
        if verify and self._stamps:
            stamp = st.load(directory, ref.manifest_sha256).get(name)
            now = st.FileStamp.of(os.fstat(raw.fileno()))
            if stamp == now and now.size_bytes == entry.size_bytes:
                verify = False  # the bytes whose hashes were checked, unchanged since
            elif stamp is not None:
                logger.info("%s/%s changed since it was verified: re-hashing it", ref.uri, name)
        reader = CheckpointReader(
            raw,
            uri=ref.uri,
            name=name,
            size_bytes=entry.size_bytes,
            sha256=entry.sha256,
            chunk_bytes=entry.chunk_bytes,
            verify=verify,
        )
        with reader:
            yield reader
            reader.finish()

    def read(self, ref: CheckpointRef, *, verify: bool = True) -> dict[str, bytes]:
        """Every file of `ref` in memory, each checked against the manifest."""
        m, _ = self._read_manifest(ref)
        out: dict[str, bytes] = {}
        for name in sorted(m.files):
            with self._open_verified(ref, m, name, verify=verify) as reader:
                out[name] = reader.read()
        return out

    # -- copy ---------------------------------------------------------------------------

    def copy(
        self,
        ref: CheckpointRef,
        dest: CheckpointStore,
        *,
        request_id: str,
        progress: Progress | None = None,
    ) -> CheckpointRef:
        """Copy `ref` into `dest`, streamed in chunks, and return the verified copy.

        Idempotent: a repeated `request_id` returns the copy it made (as long as that copy
        is still published) without reading anything else, and a destination that already
        holds a verified copy of the same checkpoint is returned as is. Source bytes are
        checked against the source manifest on the way (a corrupt source raises
        CorruptCheckpoint and publishes nothing); the destination is re-read and verified
        before returning. The source is only ever opened for reading."""
        if not isinstance(request_id, str) or not request_id:
            raise InputError(
                "checkpoint copy", "request_id", "a non-empty string", got=repr(request_id)
            )
        self._ref_dir(ref)
        marker = dest._request_marker(ref.job_id, request_id)
        done = dest._read_request(marker)
        if done is not None:
            if (done.job_id, done.step, done.manifest_sha256) != (
                ref.job_id,
                ref.step,
                ref.manifest_sha256,
            ):
                raise InputError(
                    "checkpoint copy",
                    "request_id",
                    f"a new request id for a different checkpoint (it was used for {done.uri})",
                    got=request_id,
                )
            if dest._published_sha(done.job_id, done.step) == done.manifest_sha256:
                try:
                    dest.verify(done)  # the copy may have rotted since: never hand it back
                except CorruptCheckpoint as exc:
                    if dest.root_uri == self.root_uri:
                        raise
                    logger.warning(
                        "the copy of request %s at %s is corrupt (%s); copying it again",
                        request_id,
                        done.uri,
                        exc,
                    )
                    dest._unpublish(done.job_id, done.step)
                else:
                    logger.info("copy %s already done as %s", request_id, done.uri)
                    return done
        existing = dest._published_sha(ref.job_id, ref.step)
        if existing is not None:
            if existing != ref.manifest_sha256:
                raise CheckpointExists(
                    f"{dest._dir_uri(ref.job_id, ref.step)}: holds a different checkpoint of "
                    f"job {ref.job_id} at step {ref.step} (manifest {existing[:16]}…, "
                    f"copying {ref.manifest_sha256[:16]}…); nothing was copied"
                )
            dref = dest._ref_like(ref)
            try:
                dest.verify(dref)
            except CorruptCheckpoint as exc:
                if dest.root_uri == self.root_uri:  # the source itself: keep it, say so
                    raise
                logger.warning("the copy at %s is corrupt (%s); copying it again", dref.uri, exc)
                dest._unpublish(ref.job_id, ref.step)
            else:
                dest._write_request(marker, request_id, dref)
                return dref
        m, blob = self._read_manifest(ref)
        dest_dir = dest._dir_path(ref.job_id, ref.step)
        dest._fs.makedirs(dest_dir, exist_ok=True)
        total = m.size_bytes
        copied = 0
        try:
            for name in sorted(m.files):
                copied = self._copy_file(
                    ref, name, m.files[name], dest, dest_dir, copied, total, progress
                )
            dest._publish(dest_dir, blob)
        except BaseException:
            dest._discard_unpublished(dest_dir)
            raise
        dref = dest._ref_like(ref)
        dest.verify(dref)
        dest._write_request(marker, request_id, dref)
        logger.info("copied %s to %s (%d bytes, request %s)", ref.uri, dref.uri, total, request_id)
        return dref

    def _copy_file(
        self,
        ref: CheckpointRef,
        name: str,
        entry: mf.FileEntry,
        dest: CheckpointStore,
        dest_dir: str,
        copied: int,
        total: int,
        progress: Progress | None,
    ) -> int:
        """Stream one file; a helper thread reads the next block (the hashing pool checks
        the chunk digests) while this thread writes the current one. Returns the bytes
        copied so far in all."""
        if "/" in name:
            dest._fs.makedirs(f"{dest_dir}/{name}".rsplit("/", 1)[0], exist_ok=True)
        chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=2)
        stop = threading.Event()
        check = ChunkHasher(entry.chunk_bytes, expected=entry.sha256)

        def produce() -> None:
            try:
                with self._fs.open(
                    f"{self._ref_dir(ref)}/{name}", "rb", block_size=CHUNK_BYTES
                ) as src:
                    while not stop.is_set():
                        data = src.read(CHUNK_BYTES)
                        check.add(data)  # bytes never change: hashed in the background
                        if not data:
                            check.finish()
                        chunks.put(data)
                        if not data:
                            return
            except BaseException as exc:
                chunks.put(exc)

        reader = threading.Thread(target=produce, name="ckpt-copy-read", daemon=True)
        reader.start()
        size = 0
        try:
            with dest._create(f"{dest_dir}/{name}") as out:
                flusher = Flusher(out) if dest._fsync and not isinstance(out, DirectFile) else None
                try:
                    while True:
                        item = chunks.get()
                        if isinstance(item, FileNotFoundError):
                            raise CorruptCheckpoint(ref.uri, name, "missing") from item
                        if isinstance(item, BaseException):
                            raise item
                        if not item:
                            break
                        size += len(item)
                        if size > entry.size_bytes:
                            raise CorruptCheckpoint(
                                ref.uri,
                                name,
                                f"size differs (manifest {entry.size_bytes} bytes, file is longer)",
                            )
                        out.write(item)
                        if flusher is not None:
                            flusher.wrote(len(item))
                        copied += len(item)
                        if progress is not None:
                            progress(copied, total)
                finally:
                    if flusher is not None:
                        flusher.close()
        finally:
            stop.set()
            with suppress(queue.Empty):
                while True:  # unblock the reader if it waits on a full queue
                    chunks.get_nowait()
            reader.join()
            check.close()
        if size != entry.size_bytes:
            raise CorruptCheckpoint(
                ref.uri, name, f"size differs (manifest {entry.size_bytes} bytes, file {size})"
            )
        bad = check.mismatch()
        if bad is not None:
            index, want, got = bad
            raise chunk_differs(ref.uri, name, index, *entry.chunk_range(index), want, got)
        if total == 0 and progress is not None:
            progress(0, 0)
        return copied

    def _ref_like(self, ref: CheckpointRef) -> CheckpointRef:
        return CheckpointRef(
            uri=self._dir_uri(ref.job_id, ref.step),
            job_id=ref.job_id,
            step=ref.step,
            created_at_s=ref.created_at_s,
            size_bytes=ref.size_bytes,
            manifest_sha256=ref.manifest_sha256,
        )

    def _published_sha(self, job_id: str, step: int) -> str | None:
        try:
            return mf.sha256_hex(
                self._fs.cat_file(f"{self._dir_path(job_id, step)}/{mf.MANIFEST_NAME}")
            )
        except FileNotFoundError:
            return None

    def _request_marker(self, job_id: str, request_id: str) -> str:
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:32]
        return f"{self._job_path(job_id)}/{REQUESTS_DIR}/{digest}.json"

    def _read_request(self, marker: str) -> CheckpointRef | None:
        try:
            body = json.loads(self._fs.cat_file(marker))
            return CheckpointRef(**body["ref"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            logger.warning("ignoring the unreadable copy record %s", marker)
            return None

    def _write_request(self, marker: str, request_id: str, ref: CheckpointRef) -> None:
        body = {
            "request_id": request_id,
            "ref": {
                "uri": ref.uri,
                "job_id": ref.job_id,
                "step": ref.step,
                "created_at_s": ref.created_at_s,
                "size_bytes": ref.size_bytes,
                "manifest_sha256": ref.manifest_sha256,
            },
        }
        directory = marker.rsplit("/", 1)[0]
        self._fs.makedirs(directory, exist_ok=True)
        tmp = f"{directory}/.{uuid.uuid4().hex}.tmp"
        self._fs.pipe_file(tmp, json.dumps(body, sort_keys=True).encode())
        self._fs.mv(tmp, marker)

    # -- delete -------------------------------------------------------------------------

    def _unpublish(self, job_id: str, step: int) -> None:
        with suppress(FileNotFoundError):
            self._fs.rm(f"{self._dir_path(job_id, step)}/{mf.MANIFEST_NAME}")

    def _delete(self, ref: CheckpointRef) -> None:
        directory = self._ref_dir(ref)
        self._unpublish(ref.job_id, ref.step)  # invisible first, then the bytes
        with suppress(FileNotFoundError):
            self._fs.rm(directory, recursive=True)
        logger.info("deleted checkpoint %s", ref.uri)

    def quarantine(self, ref: CheckpointRef) -> None:
        """Unpublish a corrupt checkpoint (its files stay until `retain` sweeps them), so the
        step can be written again. Refuses (PermanentError) if `ref` verifies."""
        try:
            self.verify(ref)
        except CorruptCheckpoint as exc:
            logger.warning("quarantining %s: %s", ref.uri, exc)
            directory = self._ref_dir(ref)
            with suppress(FileNotFoundError):
                self._fs.mv(
                    f"{directory}/{mf.MANIFEST_NAME}",
                    f"{directory}/.{mf.MANIFEST_NAME}.corrupt-{uuid.uuid4().hex[:8]}",
                )
            return
        raise PermanentError(f"{ref.uri}: verifies; only a corrupt checkpoint is quarantined")

    def retain(
        self, job_id: str, *, keep: int, pinned: Collection[str] = frozenset()
    ) -> builtins.list[CheckpointRef]:
        """Delete all but the newest `keep` checkpoints of `job_id`; return what was deleted.

        Never deleted: the newest checkpoint that verifies (even if older than the `keep`
        newest), and any whose `uri` or `manifest_sha256` is in `pinned` (e.g. not yet
        verified-copied elsewhere). Unpublished directories older than the newest published
        checkpoint (left by crashed writers) are removed too."""
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
            raise InputError("checkpoint retention", "keep", "an integer >= 0", got=repr(keep))
        refs = self.list(job_id)
        protected: CheckpointRef | None = None
        for ref in reversed(refs):
            try:
                self.verify(ref)
            except CorruptCheckpoint as exc:
                logger.warning("retention: %s does not verify (%s)", ref.uri, exc)
                continue
            protected = ref
            break
        deleted: builtins.list[CheckpointRef] = []
        for ref in refs[: max(len(refs) - keep, 0)]:
            if ref == protected:
                logger.info("retention keeps %s: the newest verified checkpoint", ref.uri)
                continue
            if ref.uri in pinned or ref.manifest_sha256 in pinned:
                logger.info("retention keeps %s: pinned", ref.uri)
                continue
            self._delete(ref)
            deleted.append(ref)
        if refs:
            self._sweep_unpublished(job_id, below_step=refs[-1].step)
        return deleted

    def _sweep_unpublished(self, job_id: str, *, below_step: int) -> None:
        for path in self._fs.glob(f"{self._job_path(job_id)}/step-*"):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            try:
                step = int(name.removeprefix("step-"))
            except ValueError:
                continue
            if step >= below_step or self._fs.exists(f"{path}/{mf.MANIFEST_NAME}"):
                continue
            logger.info("removing the unpublished directory %s/%s/%s", self.root_uri, job_id, name)
            with suppress(FileNotFoundError):
                self._fs.rm(path, recursive=True)
