"""Chunk hashing: the digests do not depend on how the stream is cut, which thread hashes
what, or whether the caller waits for it."""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import random
from pathlib import Path

import pytest

from orchestrator.checkpoints import CorruptCheckpoint
from orchestrator.checkpoints.hashio import CheckpointReader, ChunkHasher, DirectFile, FileWriter

CHUNK = 1 << 20
DATA = random.Random(0).randbytes(7 * CHUNK + 12345)


def chunk_digests(data: bytes, chunk: int) -> tuple[str, ...]:
    return tuple(
        hashlib.sha256(data[i : i + chunk]).hexdigest() for i in range(0, len(data), chunk)
    ) or (hashlib.sha256(b"").hexdigest(),)


def cuts(seed: int, total: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out, pos = [], 0
    while pos < total:
        n = rng.choice([1, 100, 4096, CHUNK // 3, CHUNK - 1, CHUNK, 2 * CHUNK + 5, 3 * CHUNK])
        out.append((pos, min(pos + n, total)))
        pos += n
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("stable", [False, True])
def test_digests_do_not_depend_on_the_cuts(seed: int, stable: bool) -> None:
    hasher = ChunkHasher(CHUNK)
    keep = []
    for start, end in cuts(seed, len(DATA)):
        piece = bytearray(DATA[start:end])
        hasher.add(piece)
        if stable:
            keep.append(piece)
        else:
            hasher.settle()
            piece[:] = bytes(len(piece))  # the caller reuses its buffer
    assert hasher.finish() == chunk_digests(DATA, CHUNK)


def test_a_chunk_much_larger_than_the_pieces_hashes_in_order() -> None:
    data = DATA * 6  # ~44 MiB in one chunk: handed to the pool piece by piece
    hasher = ChunkHasher(1 << 30)
    for start in range(0, len(data), 3 * CHUNK + 1):
        hasher.add(data[start : start + 3 * CHUNK + 1])
    assert hasher.finish() == (hashlib.sha256(data).hexdigest(),)


def test_an_empty_stream_has_one_empty_chunk() -> None:
    assert ChunkHasher(CHUNK).finish() == (hashlib.sha256(b"").hexdigest(),)


@pytest.mark.parametrize("stable", [False, True])
def test_the_writer_counts_and_hashes(stable: bool) -> None:
    raw = io.BytesIO()
    writer = FileWriter(raw, "f", chunk_bytes=CHUNK)
    write = writer.write_stable if stable else writer.write
    for start, end in cuts(7, len(DATA)):
        write(memoryview(DATA)[start:end])
    writer.close()
    assert raw.getvalue() == DATA and writer.size_bytes == len(DATA)
    assert writer.digests() == chunk_digests(DATA, CHUNK)
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"more")


@pytest.mark.parametrize("stable", [False, True])
def test_the_reader_checks_every_chunk(stable: bool) -> None:
    digests = chunk_digests(DATA, CHUNK)
    bad = bytearray(DATA)
    bad[4 * CHUNK + 3] ^= 0x10
    for data, ok in ((DATA, True), (bytes(bad), False)):
        reader = CheckpointReader(
            io.BytesIO(data),
            uri="u",
            name="f",
            size_bytes=len(DATA),
            sha256=digests,
            verify=True,
            chunk_bytes=CHUNK,
        )
        buf = bytearray(len(DATA))
        try:
            with reader:
                for start, end in cuts(3, len(DATA)):
                    part = memoryview(buf)[start:end]
                    n = reader.readinto_stable(part) if stable else reader.readinto(part)
                    assert n == end - start
                reader.finish()
        except CorruptCheckpoint as exc:
            assert not ok
            assert "sha256 differs in chunk 4 " in exc.reason
        else:
            assert ok and bytes(buf) == DATA


def _direct_flag(f: DirectFile) -> bool:
    return bool(fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_DIRECT)


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")
@pytest.mark.parametrize("seed", range(3))
def test_a_direct_file_holds_exactly_what_was_written(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "f"
    f = DirectFile.open(str(path), buffer_bytes=64 << 10)  # many drains, tails in between
    if f is None:
        pytest.skip(f"{tmp_path}: the filesystem refuses O_DIRECT")
    for start, end in cuts(seed, len(DATA)):
        f.write(memoryview(DATA)[start:end])
    assert _direct_flag(f)  # whole aligned blocks went straight to the device
    f.close()
    assert path.read_bytes() == DATA


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")
def test_a_flush_at_an_unaligned_offset_carries_on_through_the_page_cache(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f"
    with DirectFile.open(str(path)) or pytest.skip("no O_DIRECT on this filesystem") as f:
        f.write(DATA[:8192])
        f.flush()
        assert _direct_flag(f)  # aligned so far
        f.write(DATA[8192:10000])
        f.flush()  # 10000 is not a block boundary: no more direct writes
        assert not _direct_flag(f)
        f.write(DATA[10000:])
    assert path.read_bytes() == DATA


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")
def test_a_direct_file_left_by_an_error_is_closed_without_flushing(tmp_path: Path) -> None:
    f = DirectFile.open(str(tmp_path / "f"))
    if f is None:
        pytest.skip("no O_DIRECT on this filesystem")
    with pytest.raises(RuntimeError, match="the writer failed"), f:
        f.write(DATA[:5000])
        raise RuntimeError("the writer failed")  # this error stands, nothing else is tried
    assert f.closed
    assert (tmp_path / "f").stat().st_size == 0  # the buffered bytes were dropped
