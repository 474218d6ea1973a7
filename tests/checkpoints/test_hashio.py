"""Chunk hashing: the digests do not depend on how the stream is cut, which thread hashes
what, or whether the caller waits for it."""

from __future__ import annotations

import hashlib
import io
import random

import pytest

from orchestrator.checkpoints import CorruptCheckpoint
from orchestrator.checkpoints.hashio import CheckpointReader, ChunkHasher, FileWriter

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
