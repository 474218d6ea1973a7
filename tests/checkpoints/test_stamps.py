"""Verification stamps: a read skips the re-hash only of files unchanged since they were
verified, on this machine and boot; anything else falls back to the full check.

A stamped read not re-hashing is shown by its one documented blind spot: bytes changed
under a stamp that still matches (bit rot below the metadata, simulated by stamping the
damaged file again) are read as they are, while `verify`, `latest` and copies, which never
trust a stamp, catch them."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from orchestrator.checkpoints import CheckpointRef, CheckpointStore, CorruptCheckpoint
from orchestrator.checkpoints import stamps as st
from tests.checkpoints.test_store import BIG, JOB, flip_byte

pytestmark = pytest.mark.skipif(st.boot_id() is None, reason="no boot id: no stamps here")


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(f"file://{tmp_path}/store", chunk_bytes=1 << 20)


@pytest.fixture
def memory() -> Iterator[CheckpointStore]:
    root = f"memory://stamps-{uuid.uuid4().hex[:8]}"
    yield CheckpointStore(root)
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def directory(store: CheckpointStore, ref: CheckpointRef) -> str:
    return store._ref_dir(ref)


def rot(store: CheckpointStore, ref: CheckpointRef, offset: int) -> None:
    """Damage a byte the way a stamp cannot see: flip it, then stamp the file as it is now
    (what a disk that rots below the metadata amounts to)."""
    flip_byte(store, ref, "state", offset)
    time.sleep(0.05)  # past the filesystem's timestamp tick: the new stamp is not racy
    st.record(
        directory(store, ref),
        ref.manifest_sha256,
        st.stat_files(directory(store, ref), ["state", "a"]),
    )


def read_state(store: CheckpointStore, ref: CheckpointRef) -> bytes:
    buf = bytearray(len(BIG))
    with store.open_file(ref, "state") as f:
        f.readinto_stable(buf)
    return bytes(buf)


def test_publish_stamps_every_file_and_an_unchanged_read_needs_no_rehash(
    store: CheckpointStore,
) -> None:
    ref = store.write(JOB, 1, {"state": BIG, "a": b"a"}, now_s=1.0)
    body = json.loads(Path(directory(store, ref), st.STAMP_NAME).read_text())
    assert body["manifest_sha256"] == ref.manifest_sha256
    assert body["boot_id"] == st.boot_id()
    assert sorted(body["files"]) == ["a", "state"]
    assert store.read(ref) == {"state": BIG, "a": b"a"}
    rot(store, ref, 12345)
    damaged = read_state(store, ref)  # the documented limit: the stamp still matches
    assert damaged != BIG and len(damaged) == len(BIG)
    with pytest.raises(CorruptCheckpoint, match="state: sha256 differs in chunk 0 "):
        store.verify(ref)  # never trusts a stamp
    with pytest.raises(CorruptCheckpoint, match="sha256 differs"):
        CheckpointStore(store.root_uri, stamps=False).read(ref)
    assert store.latest(JOB) is None


def test_a_byte_changed_after_the_stamp_is_caught_by_the_read(store: CheckpointStore) -> None:
    ref = store.write(JOB, 1, {"state": BIG, "a": b"a"}, now_s=1.0)
    time.sleep(0.05)
    flip_byte(store, ref, "state", len(BIG) - 1)  # an ordinary write: ctime and mtime move
    with pytest.raises(CorruptCheckpoint, match="state: sha256 differs in chunk 9 "):
        read_state(store, ref)
    with pytest.raises(CorruptCheckpoint, match="sha256 differs"):
        store.read(ref)


def test_a_change_in_the_same_tick_as_the_stamp_is_not_trusted(store: CheckpointStore) -> None:
    ref = store.write(JOB, 1, {"state": BIG, "a": b"a"}, now_s=1.0)
    rot(store, ref, 7)
    stamp_file = Path(directory(store, ref), st.STAMP_NAME)
    changed = os.stat(Path(directory(store, ref), "state")).st_ctime_ns
    os.utime(stamp_file, ns=(changed, changed))  # stamped in the tick of the last change
    with pytest.raises(CorruptCheckpoint, match="sha256 differs in chunk 0 "):
        read_state(store, ref)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda body: {**body, "boot_id": "another-boot"},
        lambda body: {**body, "manifest_sha256": "0" * 64},
        lambda body: {**body, "files": {k: [0, *v[1:]] for k, v in body["files"].items()}},
        lambda body: "not a stamp",
        None,  # torn or garbage
    ],
    ids=["other-boot", "other-manifest", "other-size", "not-an-object", "garbage"],
)
def test_a_stamp_that_does_not_fit_means_the_full_check(
    store: CheckpointStore, tamper: object
) -> None:
    ref = store.write(JOB, 1, {"state": BIG, "a": b"a"}, now_s=1.0)
    rot(store, ref, 99)
    stamp_file = Path(directory(store, ref), st.STAMP_NAME)
    stat = os.stat(stamp_file)
    if callable(tamper):
        stamp_file.write_text(json.dumps(tamper(json.loads(stamp_file.read_text()))))
    else:
        stamp_file.write_bytes(b'{"manifest_sha256": ')
    os.utime(stamp_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # not the tick that fails it
    with pytest.raises(CorruptCheckpoint, match="sha256 differs in chunk 0 "):
        read_state(store, ref)


def test_verify_and_copies_stamp_what_they_checked(
    store: CheckpointStore, tmp_path: Path, memory: CheckpointStore
) -> None:
    ref = store.write(JOB, 1, {"state": BIG, "a": b"a"}, now_s=1.0)
    stamp_file = Path(directory(store, ref), st.STAMP_NAME)
    stamp_file.unlink()
    store.verify(ref)
    assert json.loads(stamp_file.read_text())["manifest_sha256"] == ref.manifest_sha256
    dest = CheckpointStore(f"file://{tmp_path}/region-b")
    copy = store.copy(ref, dest, request_id="r")  # verified at the destination: stamped there
    body = json.loads(Path(directory(dest, copy), st.STAMP_NAME).read_text())
    assert body["manifest_sha256"] == ref.manifest_sha256
    assert dest.read(copy) == {"state": BIG, "a": b"a"}
    back = dest.copy(copy, memory, request_id="m")
    assert memory.read(back) == {"state": BIG, "a": b"a"}  # no stamps off local disks
    assert not any(st.STAMP_NAME in p for p in memory._fs.find(memory._root))


def test_a_store_without_stamps_writes_none(tmp_path: Path) -> None:
    plain = CheckpointStore(f"file://{tmp_path}/store", stamps=False)
    ref = plain.write(JOB, 1, {"state": BIG}, now_s=1.0)
    plain.verify(ref)
    assert sorted(p.name for p in Path(directory(plain, ref)).iterdir()) == [
        "manifest.json",
        "state",
    ]
