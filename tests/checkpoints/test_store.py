"""The checkpoint store: atomic publish, verification, fall back, copies, retention.

Every behaviour runs on file:// and memory:// (s3:// and gs:// go through the same fsspec
calls)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from orchestrator.checkpoints import (
    CheckpointExists,
    CheckpointRef,
    CheckpointStore,
    CorruptCheckpoint,
    WriteFn,
)
from orchestrator.errors import InputError, PermanentError

REPO = Path(__file__).resolve().parents[2]
JOB = "job-1"
BIG = bytes(range(256)) * 40_000  # ~10 MB: several hash/copy chunks


@pytest.fixture
def memory_root() -> Iterator[str]:
    root = f"memory://ckpt-{uuid.uuid4().hex[:8]}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture(params=["file", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path, memory_root: str) -> CheckpointStore:
    if request.param == "file":
        return CheckpointStore(f"file://{tmp_path}/store")
    return CheckpointStore(memory_root)


@pytest.fixture
def other() -> Iterator[CheckpointStore]:
    """A second store (memory://): copies run file -> memory and memory -> memory."""
    root = f"memory://dest-{uuid.uuid4().hex[:8]}"
    yield CheckpointStore(root)
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def fs_path(store: CheckpointStore, ref: CheckpointRef, name: str) -> str:
    return f"{store._ref_dir(ref)}/{name}"


def flip_byte(store: CheckpointStore, ref: CheckpointRef, name: str, offset: int) -> None:
    path = fs_path(store, ref, name)
    data = bytearray(store._fs.cat_file(path))
    data[offset] ^= 0x01
    store._fs.pipe_file(path, bytes(data))


def write_n(store: CheckpointStore, n: int, job: str = JOB) -> list[CheckpointRef]:
    return [
        store.write(
            job,
            step,
            {"state": f"state {step}".encode() * 100, "extra/meta.json": b"{}"},
            now_s=1000.0 + step,
        )
        for step in range(1, n + 1)
    ]


# -- write, list, read ------------------------------------------------------------------


def test_write_then_list_and_read(store: CheckpointStore) -> None:
    a = store.write(
        JOB,
        10,
        {"model": BIG, "opt/adam.bin": b"x" * 7},
        now_s=123.5,
        metadata={"reason": "periodic"},
    )

    def stream(open_file: WriteFn) -> None:
        with open_file("model") as f:
            f.write(memoryview(BIG)[:1000])
            f.write(bytearray(BIG[1000:]))

    b = store.write(JOB, 20, stream, now_s=124.0)
    assert store.list(JOB) == [a, b]
    assert store.latest(JOB) == b
    assert a.uri == f"{store.root_uri}/{JOB}/step-000000000010"
    assert (a.step, a.created_at_s, a.size_bytes) == (10, 123.5, len(BIG) + 7)
    assert store.read(a) == {"model": BIG, "opt/adam.bin": b"x" * 7}
    assert store.read(b) == {"model": BIG}
    assert store.metadata(a) == {"reason": "periodic"}
    m = store.manifest(a)
    assert m.files["opt/adam.bin"].size_bytes == 7
    with store.open_file(b, "model") as f:
        buf = bytearray(len(BIG))
        assert f.readinto(buf) == len(BIG)
    assert bytes(buf) == BIG
    assert store.list("other-job") == [] and store.latest("other-job") is None


def test_manifest_lists_sizes_and_sha256_and_is_written_last(store: CheckpointStore) -> None:
    seen_manifest_while_writing: list[bool] = []

    def stream(open_file: WriteFn) -> None:
        for name in ("a", "b"):
            with open_file(name) as f:
                f.write(name.encode() * 10)
            seen_manifest_while_writing.append(
                store._fs.exists(f"{store._dir_path(JOB, 1)}/manifest.json")
            )
            assert store.list(JOB) == []

    ref = store.write(JOB, 1, stream, now_s=5.0)
    assert seen_manifest_while_writing == [False, False]
    body = json.loads(store._fs.cat_file(f"{store._ref_dir(ref)}/manifest.json"))
    assert (body["format"], body["version"]) == ("heliotrope-checkpoint", 2)
    assert body["files"]["a"] == {
        "size_bytes": 10,
        "chunk_bytes": 16 << 20,
        "sha256": [hashlib.sha256(b"a" * 10).hexdigest()],
    }
    assert (body["job_id"], body["step"], body["created_at_s"]) == (JOB, 1, 5.0)


def test_a_writer_that_fails_midway_publishes_nothing(store: CheckpointStore) -> None:
    (first,) = write_n(store, 1)

    def crash(open_file: WriteFn) -> None:
        with open_file("state") as f:
            f.write(BIG)
        raise RuntimeError("killed while writing")

    with pytest.raises(RuntimeError):
        store.write(JOB, 2, crash, now_s=2.0)
    assert store.list(JOB) == [first]
    assert store.latest(JOB) == first
    assert not store._fs.exists(store._dir_path(JOB, 2))  # cleaned up


def test_a_crash_just_before_the_rename_leaves_nothing_visible(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    (first,) = write_n(store, 1)

    def die(*_a: object, **_k: object) -> None:
        raise SystemExit("power cut")

    # the process "dies" with the data files and the temporary manifest on storage
    monkeypatch.setattr(store._fs, "mv", die)
    monkeypatch.setattr(store, "_discard_unpublished", lambda _d: None)
    with pytest.raises(SystemExit):
        store.write(JOB, 2, {"state": BIG}, now_s=2.0)
    monkeypatch.undo()
    leftovers = store._fs.ls(store._dir_path(JOB, 2), detail=False)
    assert any(".manifest.json." in p for p in leftovers) and len(leftovers) == 2
    assert store.list(JOB) == [first] and store.latest(JOB) == first
    # a later checkpoint, then retention sweeps the abandoned directory
    third = store.write(JOB, 3, {"state": b"3"}, now_s=3.0)
    assert store.retain(JOB, keep=5) == []
    assert not store._fs.exists(store._dir_path(JOB, 2))
    assert store.list(JOB) == [first, third]


def test_sigkill_during_a_write_leaves_nothing_visible(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/store"
    store = CheckpointStore(root)
    (first,) = write_n(store, 1)
    script = textwrap.dedent(f"""
        import time
        from orchestrator.checkpoints import CheckpointStore
        def slow(open_file):
            with open_file("state") as f:
                for _ in range(1000):
                    f.write(b"x" * 65536)
                    f.flush()
                    time.sleep(0.01)
        CheckpointStore({root!r}).write({JOB!r}, 2, slow, now_s=2.0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    data = tmp_path / "store" / JOB / "step-000000000002" / "state"
    deadline = time.monotonic() + 20
    while not (data.exists() and data.stat().st_size > 0):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    assert data.exists()  # the partial file is there ...
    assert store.list(JOB) == [first]  # ... and invisible
    assert store.latest(JOB) == first


def test_a_published_step_is_never_rewritten(store: CheckpointStore) -> None:
    (ref,) = write_n(store, 1)
    with pytest.raises(CheckpointExists):
        store.write(JOB, 1, {"state": b"other"}, now_s=9.0)
    store.verify(ref)
    with pytest.raises(PermanentError, match="verifies"):
        store.quarantine(ref)
    flip_byte(store, ref, "state", 3)
    store.quarantine(ref)  # corrupt: unpublished, so the step can be written again
    assert store.list(JOB) == []
    new = store.write(JOB, 1, {"state": b"again"}, now_s=9.0)
    assert store.read(new) == {"state": b"again"}


@pytest.mark.parametrize(
    ("job", "step", "files"),
    [
        ("../etc", 1, {"a": b""}),
        ("", 1, {"a": b""}),
        ("job 1", 1, {"a": b""}),
        (JOB, -1, {"a": b""}),
        (JOB, True, {"a": b""}),
        (JOB, 1, {}),
        (JOB, 1, {"../a": b""}),
        (JOB, 1, {"manifest.json": b""}),
        (JOB, 1, {".hidden": b""}),
        (JOB, 1, {"a//b": b""}),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(
    store: CheckpointStore, job: str, step: int, files: dict[str, bytes]
) -> None:
    with pytest.raises(InputError):
        store.write(job, step, files, now_s=0.0)
    if job == JOB:
        assert store.list(JOB) == []


@pytest.mark.parametrize("now_s", [float("nan"), float("inf"), "0"])
def test_a_bad_time_is_refused(store: CheckpointStore, now_s: float) -> None:
    with pytest.raises(InputError, match="now_s"):
        store.write(JOB, 1, {"a": b""}, now_s=now_s)


def test_a_ref_of_another_store_is_refused(store: CheckpointStore, other: CheckpointStore) -> None:
    (ref,) = write_n(store, 1)
    with pytest.raises(InputError, match=r"ref\.uri"):
        other.verify(ref)


def test_backends_are_imported_only_when_used() -> None:
    code = (
        "import sys, orchestrator.checkpoints as c; "
        "bad = [m for m in ('torch', 's3fs', 'gcsfs', 'boto3', 'pandas') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_a_missing_backend_says_what_to_install() -> None:
    if importlib.util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed")
    with pytest.raises(PermanentError, match="s3fs"):
        CheckpointStore("s3://bucket/prefix")


# -- verification and fall back ---------------------------------------------------------


def test_verify_catches_one_flipped_byte_and_latest_falls_back(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    old = store.write(JOB, 1, {"state": BIG}, now_s=1.0)
    new = store.write(JOB, 2, {"state": BIG, "small": b"abc"}, now_s=2.0)
    flip_byte(store, new, "state", len(BIG) // 2 + 12345)
    with pytest.raises(CorruptCheckpoint) as info:
        store.verify(new)
    assert info.value.file == "state" and "sha256 differs" in info.value.reason
    assert str(info.value).startswith(f"{new.uri}/state: sha256 differs")
    with caplog.at_level(logging.WARNING):
        assert store.latest(JOB) == old
    assert any(
        "step-000000000002" in r.getMessage() and "corrupt" in r.getMessage()
        for r in caplog.records
    )
    assert store.latest(JOB, verify=False) == new
    with pytest.raises(CorruptCheckpoint):
        store.read(new)
    with pytest.raises(CorruptCheckpoint), store.open_file(new, "state") as f:
        f.read(10)  # the rest is checked on leaving the block


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate", "size differs"),
        ("extend", "size differs"),
        ("delete", "missing"),
        ("manifest", "differs from the reference"),
    ],
)
def test_verify_names_what_differs(store: CheckpointStore, damage: str, reason: str) -> None:
    ref = store.write(JOB, 1, {"a": b"aaaa", "b": BIG}, now_s=1.0)
    path = fs_path(store, ref, "b")
    if damage == "truncate":
        store._fs.pipe_file(path, BIG[:-1])
    elif damage == "extend":
        store._fs.pipe_file(path, BIG + b"\0")
    elif damage == "delete":
        store._fs.rm(path)
    else:
        mpath = fs_path(store, ref, "manifest.json")
        store._fs.pipe_file(mpath, store._fs.cat_file(mpath).replace(b'"step": 1', b'"step": 1 '))
    with pytest.raises(CorruptCheckpoint, match=reason) as info:
        store.verify(ref)
    if damage == "manifest":  # the ref no longer names what is stored
        assert info.value.file == "manifest.json"
        assert store.latest(JOB) != ref
    else:
        assert info.value.file == "b"
        assert store.latest(JOB) is None


# -- copy -------------------------------------------------------------------------------


def snapshot_tree(store: CheckpointStore) -> dict[str, bytes]:
    return {p: store._fs.cat_file(p) for p in store._fs.find(store._root)}


def test_copy_streams_verifies_and_keeps_the_identity(
    store: CheckpointStore, other: CheckpointStore
) -> None:
    ref = store.write(JOB, 7, {"state": BIG * 3, "opt/x": b"opt"}, now_s=77.0)
    before = snapshot_tree(store)
    seen: list[tuple[int, int]] = []
    copy = store.copy(
        ref, other, request_id="mig-1/copy", progress=lambda done, total: seen.append((done, total))
    )
    assert copy.uri == f"{other.root_uri}/{JOB}/step-000000000007"
    assert (copy.manifest_sha256, copy.created_at_s, copy.size_bytes, copy.step) == (
        ref.manifest_sha256,
        77.0,
        ref.size_bytes,
        7,
    )
    other.verify(copy)
    assert other.read(copy) == store.read(ref)
    assert len(seen) > 3 and seen[-1] == (ref.size_bytes, ref.size_bytes)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert snapshot_tree(store) == before  # the source is never touched
    # and back the other way, into a fresh root of the first kind
    back = CheckpointStore(store.root_uri + "-back")
    assert other.copy(copy, back, request_id="back").manifest_sha256 == ref.manifest_sha256


def test_copy_is_idempotent(store: CheckpointStore, other: CheckpointStore) -> None:
    ref = store.write(JOB, 7, {"state": BIG}, now_s=77.0)
    first = store.copy(ref, other, request_id="r-1")
    store._fs.rm(store._ref_dir(ref), recursive=True)  # the source is gone now
    assert store.copy(ref, other, request_id="r-1") == first  # same request: its result
    assert store.copy(ref, other, request_id="r-2") == first  # verified copy already there
    assert other.list(JOB) == [first]
    with pytest.raises(InputError, match="request_id"):
        other.copy(other.write(JOB, 8, {"s": b"8"}, now_s=8.0), other, request_id="r-1")


def test_a_corrupt_source_is_not_copied(store: CheckpointStore, other: CheckpointStore) -> None:
    ref = store.write(JOB, 7, {"state": BIG}, now_s=77.0)
    flip_byte(store, ref, "state", 100)
    with pytest.raises(CorruptCheckpoint) as info:
        store.copy(ref, other, request_id="r")
    assert info.value.uri == ref.uri and info.value.file == "state"
    assert other.list(JOB) == []


def test_a_copy_interrupted_midway_is_invisible_and_a_retry_completes(
    store: CheckpointStore, other: CheckpointStore
) -> None:
    ref = store.write(JOB, 7, {"state": BIG * 2}, now_s=77.0)

    def die(done: int, _total: int) -> None:
        if done > len(BIG):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.copy(ref, other, request_id="r", progress=die)
    assert other.list(JOB) == []
    assert store.copy(ref, other, request_id="r").manifest_sha256 == ref.manifest_sha256


def test_a_corrupt_copy_is_copied_again(store: CheckpointStore, other: CheckpointStore) -> None:
    ref = store.write(JOB, 7, {"state": BIG}, now_s=77.0)
    copy = store.copy(ref, other, request_id="r-1")
    flip_byte(other, copy, "state", 5)
    assert store.copy(ref, other, request_id="r-2") == copy
    other.verify(copy)


def test_copy_refuses_to_overwrite_a_different_checkpoint(
    store: CheckpointStore, other: CheckpointStore
) -> None:
    ref = store.write(JOB, 7, {"state": BIG}, now_s=77.0)
    theirs = other.write(JOB, 7, {"state": b"a different history"}, now_s=78.0)
    with pytest.raises(CheckpointExists):
        store.copy(ref, other, request_id="r")
    assert other.read(theirs) == {"state": b"a different history"}


# -- retention --------------------------------------------------------------------------


def test_retain_keeps_the_newest(store: CheckpointStore) -> None:
    refs = write_n(store, 5)
    assert store.retain(JOB, keep=2) == refs[:3]
    assert store.list(JOB) == refs[3:]
    assert not store._fs.exists(store._dir_path(JOB, 1))


def test_retain_never_deletes_the_newest_verified(store: CheckpointStore) -> None:
    refs = write_n(store, 5)
    for ref in refs[3:]:
        flip_byte(store, ref, "state", 0)
    # keep=1 keeps #5 (corrupt) and #3 (newest verified); #4 is corrupt and older
    assert store.retain(JOB, keep=1) == [refs[0], refs[1], refs[3]]
    assert store.list(JOB) == [refs[2], refs[4]]
    assert store.latest(JOB) == refs[2]
    assert store.retain(JOB, keep=0) == [refs[4]]
    assert store.list(JOB) == [refs[2]]


def test_retain_keeps_pinned_checkpoints(store: CheckpointStore) -> None:
    refs = write_n(store, 4)
    pinned = {refs[0].uri, refs[1].manifest_sha256}
    assert store.retain(JOB, keep=1, pinned=pinned) == [refs[2]]
    assert store.list(JOB) == [refs[0], refs[1], refs[3]]


def test_retain_sweeps_only_abandoned_unpublished_directories(store: CheckpointStore) -> None:
    refs = write_n(store, 3)
    below = f"{store._root}/{JOB}/step-000000000002"  # published: untouched
    in_progress = store._dir_path(JOB, 9)  # a writer may be busy here: untouched
    crashed = store._dir_path(JOB, 0)  # older than what is published: abandoned
    for directory in (in_progress, crashed):
        store._fs.makedirs(directory, exist_ok=True)
        store._fs.pipe_file(f"{directory}/state", b"partial")
    assert store.retain(JOB, keep=10) == []
    assert not store._fs.exists(crashed)
    assert store._fs.exists(f"{in_progress}/state")
    assert store._fs.exists(below)
    assert store.list(JOB) == refs


def test_retain_refuses_a_negative_keep(store: CheckpointStore) -> None:
    with pytest.raises(InputError, match="keep"):
        store.retain(JOB, keep=-1)


def test_list_skips_an_unreadable_manifest(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    refs = write_n(store, 2)
    store._fs.pipe_file(fs_path(store, refs[1], "manifest.json"), b"{not json")
    with caplog.at_level(logging.WARNING):
        assert store.list(JOB) == [refs[0]]
    assert "unreadable manifest" in caplog.text


def test_plain_paths_are_file_uris(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path / "s") + "/")
    assert store.root_uri == f"file://{tmp_path}/s"
    ref = store.write(JOB, 1, {"a": b"1"}, now_s=0.0)
    assert os.path.isfile(tmp_path / "s" / JOB / "step-000000000001" / "manifest.json")
    assert CheckpointStore(f"file://{tmp_path}/s").latest(JOB) == ref


# -- chunk digests ----------------------------------------------------------------------

CHUNK = 1 << 20  # large enough that chunks hash on the pool, not inline


@pytest.fixture(params=["file", "memory"])
def chunked(request: pytest.FixtureRequest, tmp_path: Path, memory_root: str) -> CheckpointStore:
    if request.param == "file":
        return CheckpointStore(f"file://{tmp_path}/chunked", chunk_bytes=CHUNK)
    return CheckpointStore(memory_root, chunk_bytes=CHUNK)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_manifest_has_the_sha256_of_every_chunk(chunked: CheckpointStore) -> None:
    def stream(open_file: WriteFn) -> None:
        with open_file("state") as f:  # cut across chunk boundaries, both kinds of write
            f.write(BIG[:1000])
            f.write_stable(memoryview(BIG)[1000 : 3 * CHUNK + 5])
            f.write(bytearray(BIG[3 * CHUNK + 5 :]))
        with open_file("empty"):
            pass

    ref = chunked.write(JOB, 1, stream, now_s=1.0)
    body = json.loads(chunked._fs.cat_file(f"{chunked._ref_dir(ref)}/manifest.json"))
    assert body["files"]["state"] == {
        "size_bytes": len(BIG),
        "chunk_bytes": CHUNK,
        "sha256": [sha(BIG[i : i + CHUNK]) for i in range(0, len(BIG), CHUNK)],
    }
    assert len(body["files"]["state"]["sha256"]) == 10
    assert body["files"]["empty"] == {"size_bytes": 0, "chunk_bytes": CHUNK, "sha256": [sha(b"")]}
    chunked.verify(ref)
    assert chunked.read(ref) == {"state": BIG, "empty": b""}


@pytest.mark.parametrize("offset", [0, CHUNK - 1, CHUNK, 5 * CHUNK + 7, len(BIG) - 1])
def test_one_flipped_byte_in_any_chunk_is_caught_by_every_read(
    chunked: CheckpointStore, other: CheckpointStore, offset: int
) -> None:
    ref = chunked.write(JOB, 1, {"state": BIG, "a": b"a"}, now_s=1.0)
    flip_byte(chunked, ref, "state", offset)
    differs = f"state: sha256 differs in chunk {offset // CHUNK} "
    with pytest.raises(CorruptCheckpoint, match=differs):
        chunked.verify(ref)
    with pytest.raises(CorruptCheckpoint, match=differs):
        chunked.read(ref)
    buf = bytearray(len(BIG))
    with pytest.raises(CorruptCheckpoint, match=differs), chunked.open_file(ref, "state") as f:
        f.readinto(buf)
    with pytest.raises(CorruptCheckpoint, match=differs), chunked.open_file(ref, "state") as f:
        f.readinto_stable(buf)  # checked by the end of the block at the latest
    with pytest.raises(CorruptCheckpoint, match=differs):
        chunked.copy(ref, other, request_id="r")
    assert other.list(JOB) == []
    assert chunked.latest(JOB) is None


def test_version_1_manifests_are_still_read(store: CheckpointStore, other: CheckpointStore) -> None:
    files = {"state": BIG, "b": b"bb"}
    ref = store.write(JOB, 1, files, now_s=1.0)
    mpath = fs_path(store, ref, "manifest.json")
    body = json.loads(store._fs.cat_file(mpath))
    body["version"] = 1  # one sha256 of each whole file, as version 1 wrote them
    body["files"] = {n: {"size_bytes": len(d), "sha256": sha(d)} for n, d in files.items()}
    blob = (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()
    store._fs.pipe_file(mpath, blob)
    (old,) = store.list(JOB)
    assert old.manifest_sha256 == sha(blob)
    store.verify(old)
    assert store.read(old) == files
    copy = store.copy(old, other, request_id="r")
    assert other._fs.cat_file(fs_path(other, copy, "manifest.json")) == blob
    other.verify(copy)
    flip_byte(store, old, "state", 12345)
    with pytest.raises(CorruptCheckpoint, match="state: sha256 differs in chunk 0 "):
        store.verify(old)
    with pytest.raises(CorruptCheckpoint, match="sha256 differs"):
        store.read(old)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"sha256": []}, "0 chunk digests"),
        ({"chunk_bytes": 0}, "bad chunk_bytes"),
        ({"chunk_bytes": 1}, "chunk digests for"),
        ({"sha256": "0" * 64}, "must be a list"),
        ({"sha256": ["xyz"]}, "must be a list"),
    ],
)
def test_a_manifest_with_a_bad_chunk_list_is_unreadable(
    store: CheckpointStore, caplog: pytest.LogCaptureFixture, change: dict[str, object], why: str
) -> None:
    ref = store.write(JOB, 1, {"state": b"state"}, now_s=1.0)
    mpath = fs_path(store, ref, "manifest.json")
    body = json.loads(store._fs.cat_file(mpath))
    body["files"]["state"].update(change)
    store._fs.pipe_file(mpath, json.dumps(body).encode())
    with caplog.at_level(logging.WARNING):
        assert store.list(JOB) == []
    assert why in caplog.text


def test_a_bad_chunk_size_is_refused(tmp_path: Path) -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="chunk_bytes"):
            CheckpointStore(f"file://{tmp_path}/s", chunk_bytes=bad)  # type: ignore[arg-type]


def test_a_repeated_copy_request_never_hands_back_a_corrupt_copy(
    store: CheckpointStore, other: CheckpointStore
) -> None:
    ref = store.write(JOB, 7, {"state": BIG}, now_s=77.0)
    copy = store.copy(ref, other, request_id="r-1")
    flip_byte(other, copy, "state", 5)  # the copy rots after it was made
    again = store.copy(ref, other, request_id="r-1")  # the same request, after a crash
    other.verify(again)
    assert other.read(again) == {"state": BIG}


def test_copying_a_corrupt_checkpoint_into_its_own_store_keeps_it(
    store: CheckpointStore,
) -> None:
    ref = store.write(JOB, 7, {"state": BIG}, now_s=77.0)
    flip_byte(store, ref, "state", 100)
    with pytest.raises(CorruptCheckpoint):
        store.copy(ref, store, request_id="self")
    # Still published (for a person to look at, and for `latest` to skip), not deleted.
    assert store._published_sha(JOB, 7) == ref.manifest_sha256
