"""The state format: every kind of leaf round-trips, in one stream or in shard files."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
import torch

from orchestrator.checkpoints import CheckpointStore, CorruptCheckpoint, WriteFn
from orchestrator.errors import PermanentError
from orchestrator.training.state_io import (
    load_state,
    load_state_files,
    save_state,
    save_state_files,
    state_digest,
)


def tree() -> dict[Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7))
    return {
        "model": model.state_dict(),
        3: (1, 2.5, None, "s", b"bytes", True, [torch.tensor(7)]),
        "odd": [
            torch.arange(12).view(3, 4).t(),
            torch.zeros(0, 3),
            torch.ones(2, dtype=torch.bfloat16),
            torch.tensor([True, False]),
            torch.randn(33, dtype=torch.float64),
            torch.tensor(2 + 3j),
        ],
        "nested": {"deep": [{"x": torch.randn(4, 4)}]},
    }


@pytest.fixture
def store() -> Iterator[CheckpointStore]:
    root = f"memory://state-{uuid.uuid4().hex[:8]}"
    yield CheckpointStore(root)
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def check_same(back: Any, want: Any) -> None:
    assert state_digest(back) == state_digest(want)
    assert back[3][:6] == want[3][:6]
    assert back["model"]._metadata == want["model"]._metadata
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7))
    model.load_state_dict(back["model"])


def test_one_stream_round_trip() -> None:
    want = tree()
    buf = io.BytesIO()
    assert save_state(want, buf) == len(buf.getvalue())
    buf.seek(0)
    check_same(load_state(buf), want)


@pytest.mark.parametrize(("shard_bytes", "threads"), [(1 << 20, 2), (100, 3), (7, 1)])
def test_shard_files_round_trip(store: CheckpointStore, shard_bytes: int, threads: int) -> None:
    want = tree()

    def files(open_file: WriteFn) -> None:
        save_state_files(want, open_file, shard_bytes=shard_bytes, threads=threads)

    ref = store.write("j", 1, files, now_s=0.0)
    names = sorted(store.manifest(ref).files)
    total = sum(t.numel() * t.element_size() for t in _tensors(want))
    assert names == ["state"] + [f"state.{k:04d}" for k in range(-(-total // shard_bytes))]
    back = load_state_files(lambda name: store.open_file(ref, name), threads=threads)
    check_same(back, want)


def _tensors(t: Any) -> list[torch.Tensor]:
    from orchestrator.training.state_io import map_tensors

    out: list[torch.Tensor] = []
    map_tensors(t, out.append)
    return out


def test_a_flipped_byte_in_a_shard_is_caught(store: CheckpointStore) -> None:
    def files(open_file: WriteFn) -> None:
        save_state_files(tree(), open_file, shard_bytes=64)

    ref = store.write("j", 1, files, now_s=0.0)
    path = f"{store._ref_dir(ref)}/state.0003"
    data = bytearray(store._fs.cat_file(path))
    data[10] ^= 0x80
    store._fs.pipe_file(path, bytes(data))
    with pytest.raises(CorruptCheckpoint, match=r"state\.0003: sha256 differs"):
        load_state_files(lambda name: store.open_file(ref, name))


def test_not_a_state_file() -> None:
    with pytest.raises(PermanentError, match="not a heliotrope-state"):
        load_state(io.BytesIO(b"PK\x03\x04 a torch.save zip, say"))


@pytest.mark.parametrize("offset", [0, 3 << 20, (9 << 20) - 1])
def test_a_flipped_byte_in_any_chunk_of_a_large_shard_is_caught(offset: int) -> None:
    """Shards of several chunks hash on the pool while they are read; a damaged chunk
    anywhere fails the load (nothing half-verified comes back)."""
    root = f"memory://state-{uuid.uuid4().hex[:8]}"
    store = CheckpointStore(root, chunk_bytes=1 << 20)
    want = {"w": torch.arange(9 << 18, dtype=torch.float32)}  # 9 MiB: 9 chunks

    def files(open_file: WriteFn) -> None:
        save_state_files(want, open_file, shard_bytes=5 << 20, threads=2)

    ref = store.write("j", 1, files, now_s=0.0)
    check_digest = state_digest(load_state_files(lambda name: store.open_file(ref, name)))
    assert check_digest == state_digest(want)
    shard, at = ("state.0000", offset) if offset < 5 << 20 else ("state.0001", offset - (5 << 20))
    path = f"{store._ref_dir(ref)}/{shard}"
    data = bytearray(store._fs.cat_file(path))
    data[at] ^= 0x01
    store._fs.pipe_file(path, bytes(data))
    with pytest.raises(CorruptCheckpoint, match=rf"{shard}: sha256 differs in chunk {at >> 20} "):
        load_state_files(lambda name: store.open_file(ref, name))
    fsspec.filesystem("memory").rm(root, recursive=True)
