"""Sharded checkpoints: torch.distributed.checkpoint (DCP) through the checkpoint store.

Every rank of a distributed job writes its own part of one checkpoint (its shards of the
model and optimizer state, plus its own small file of RNG states and data position) with
`CheckpointStore.write_part`; rank 0 then publishes the manifest, written last as for any
checkpoint, listing every rank's files with their chunk sha256s. A published sharded
checkpoint is an ordinary store checkpoint: `verify`, `copy` between regions and `retain`
work on it unchanged.

Files of a checkpoint written by a world of W ranks::

    dcp-metadata       DCP's global plan: which piece of which tensor is where (rank 0)
    shard-r00000 ...   the tensor bytes each rank wrote, raw (no pickling), one file a rank
    rank-r00000 ...    that rank's RNG states, data state and scheduler (`state_io`)

DCP plans the load against the state of the reading job, so a checkpoint saved by W ranks
loads into any other world size (FSDP2 shards are cut again; DDP's replicated tensors were
written once, by whichever rank DCP chose). Reads go through `CheckpointStore.open_file`:
every byte read is checked against the manifest, and a corrupt file fails the load on all
ranks at once (DCP gathers the error), so they fall back together.

Nothing here unpickles arbitrary objects from storage: `dcp-metadata` is read by an
unpickler that only knows DCP's metadata classes, and DCP's non-tensor values (optimizer
hyperparameters, ...) by `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from orchestrator.checkpoints import CheckpointRef, CheckpointStore, FileEntry, WriteFn
from orchestrator.errors import PermanentError, TransientError
from orchestrator.training.shard_layout import (
    METADATA_FILE,
    SHARDED_FORMAT,
    rank_file,
    shard_file,
)
from orchestrator.training.state_io import byte_view

__all__ = [
    "METADATA_FILE",
    "SHARDED_FORMAT",
    "Piece",
    "SafeLoadPlanner",
    "StoreReader",
    "StoreWriter",
    "portable",
    "rank_file",
    "read_metadata",
    "shard_file",
]


@dataclass(frozen=True, slots=True)
class Piece:
    """Where one item of the DCP plan lies: bytes [offset, offset + length) of `file`;
    tensors are raw bytes of `dtype` and `shape` (C order), other values `torch.save`d."""

    file: str
    offset: int
    length: int
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


class StoreWriter(StorageWriter):
    """A DCP storage writer for one rank: its shards go into `shard-r<rank>` (and, when
    given, `extra(write_fn)` writes more files of this rank) through `store.write_part`;
    the coordinator writes `dcp-metadata` in `finish`. `entries` then holds the manifest
    entries of what this rank wrote, for whoever publishes."""

    def __init__(
        self,
        store: CheckpointStore,
        job_id: str,
        step: int,
        *,
        extra: Callable[[WriteFn], None] | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.job_id = job_id
        self.step = step
        self.extra = extra
        self.entries: dict[str, FileEntry] = {}
        self.rank = 0
        self.is_coordinator = False

    def reset(self, checkpoint_id: Any = None) -> None:
        self.entries = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        if rank is None and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        self.rank = int(rank or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        try:
            return self._write_data(plan, planner)
        except Exception as exc:
            _reraise(exc)

    def _write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        name = shard_file(self.rank)
        results: list[WriteResult] = []
        keep: list[Any] = []  # alive until the file is closed (write_stable)

        def files(write_fn: WriteFn) -> None:
            with write_fn(name) as out:
                offset = 0
                for item in plan.items:
                    data = planner.resolve_data(item)
                    if item.type == WriteItemType.BYTE_IO:
                        assert isinstance(data, io.BytesIO)
                        raw = data.getvalue()
                        out.write(raw)
                        piece = Piece(name, offset, len(raw))
                    else:
                        assert isinstance(data, torch.Tensor)
                        tensor = data.detach()
                        if tensor.device.type != "cpu":
                            tensor = tensor.cpu()
                        tensor = tensor.contiguous()
                        keep.append(tensor)
                        view = byte_view(tensor)
                        out.write_stable(view)
                        piece = Piece(
                            name,
                            offset,
                            len(view),
                            str(tensor.dtype).removeprefix("torch."),
                            tuple(tensor.shape),
                        )
                    offset += piece.length
                    results.append(
                        WriteResult(
                            index=item.index, size_in_bytes=piece.length, storage_data=piece
                        )
                    )
            if self.extra is not None:
                self.extra(write_fn)

        self.entries.update(self.store.write_part(self.job_id, self.step, files))
        keep.clear()
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)

        def files(write_fn: WriteFn) -> None:
            with write_fn(METADATA_FILE) as out:
                out.write(blob)

        try:
            self.entries.update(self.store.write_part(self.job_id, self.step, files))
        except Exception as exc:
            _reraise(exc)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False  # a store checkpoint is named by its store, job and step


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else (no arbitrary callables from storage)."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith("torch.distributed.checkpoint.") or (
            module == __name__ and name == "Piece"
        ):
            return super().find_class(module, name)
        if module in ("collections", "builtins") and name in (
            "OrderedDict",
            "set",
            "frozenset",
            "slice",
        ):
            return super().find_class(module, name)
        if module == "torch.serialization" and name == "_get_layout":
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(
                value, torch.dtype | torch.layout | torch.memory_format
            ):
                return value
        raise pickle.UnpicklingError(f"{METADATA_FILE}: {module}.{name} is not DCP metadata")


def read_metadata(store: CheckpointStore, ref: CheckpointRef) -> Metadata:
    """The DCP metadata of a sharded checkpoint (checked against its manifest)."""
    with store.open_file(ref, METADATA_FILE) as f:
        blob = f.read()
    try:
        metadata = _MetadataUnpickler(io.BytesIO(blob)).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise PermanentError(f"{ref.uri}/{METADATA_FILE}: not readable: {exc}") from exc
    if not isinstance(metadata, Metadata):
        raise PermanentError(f"{ref.uri}/{METADATA_FILE}: not DCP metadata")
    return metadata


class StoreReader(StorageReader):
    """A DCP storage reader over one published sharded checkpoint. Each needed file is
    streamed once, in order, through the store's verifying reader."""

    def __init__(self, store: CheckpointStore, ref: CheckpointRef) -> None:
        super().__init__()
        self.store = store
        self.ref = ref
        self.storage_data: dict[Any, Piece] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            return read_metadata(self.store, self.ref)
        except Exception as exc:
            _reraise(exc)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = dict(metadata.storage_data or {})

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            return self._read_data(plan, planner)
        except Exception as exc:
            _reraise(exc)

    def _read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_file: dict[str, dict[Piece, list[ReadItem]]] = defaultdict(lambda: defaultdict(list))
        for req in plan.items:
            piece = self.storage_data.get(req.storage_index)
            if not isinstance(piece, Piece):
                raise PermanentError(f"{self.ref.uri}: no stored piece for {req.storage_index}")
            by_file[piece.file][piece].append(req)
        for name in sorted(by_file):
            pieces = by_file[name]
            with self.store.open_file(self.ref, name) as f:
                pos = 0
                for piece in sorted(pieces, key=lambda p: p.offset):
                    _skip(f, piece.offset - pos)
                    self._serve(f, piece, pieces[piece], planner)
                    pos = piece.offset + piece.length
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _serve(self, f: Any, piece: Piece, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        if piece.dtype is None or piece.shape is None:
            raw = _read_exact(f, piece.length, self.ref.uri, piece.file)
            for req in reqs:
                if req.type != LoadItemType.BYTE_IO:
                    raise PermanentError(
                        f"{self.ref.uri}: {req.storage_index} holds bytes, the job wants a tensor"
                    )
                planner.load_bytes(req, io.BytesIO(raw))
            return
        dtype = getattr(torch, piece.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise PermanentError(f"{self.ref.uri}: unknown dtype {piece.dtype}")
        if len(reqs) == 1 and self._read_in_place(f, piece, dtype, reqs[0], planner):
            return
        stored = torch.empty(piece.shape, dtype=dtype)
        view = byte_view(stored)
        if len(view) != piece.length:
            raise PermanentError(
                f"{self.ref.uri}: {piece.file} piece at {piece.offset} is "
                f"{piece.length} bytes, its shape needs {len(view)}"
            )
        _fill(f, view, self.ref.uri, piece.file)
        for req in reqs:
            src = stored
            for dim, (start, length) in enumerate(
                zip(req.storage_offsets, req.lengths, strict=True)
            ):
                src = src.narrow(dim, start, length)
            target = planner.resolve_tensor(req).detach()
            if target.size() != src.size():
                raise PermanentError(
                    f"{self.ref.uri}: {req.storage_index} is "
                    f"{tuple(src.size())}, the job wants "
                    f"{tuple(target.size())}"
                )
            target.copy_(src)
            planner.commit_tensor(req, target)

    def _read_in_place(
        self, f: Any, piece: Piece, dtype: torch.dtype, req: ReadItem, planner: LoadPlanner
    ) -> bool:
        """Read a whole stored piece straight into its destination when that is one
        contiguous CPU tensor of the same dtype and shape (the same world size, or a
        replicated tensor): no second copy. False when it is not."""
        if any(req.storage_offsets) or tuple(req.lengths) != piece.shape:
            return False
        target = planner.resolve_tensor(req).detach()
        if (
            target.device.type != "cpu"
            or target.dtype != dtype
            or not target.is_contiguous()
            or tuple(target.shape) != piece.shape
        ):
            return False
        view = byte_view(target)
        if len(view) != piece.length:
            return False
        _fill(f, view, self.ref.uri, piece.file)
        planner.commit_tensor(req, target)
        return True

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values load with weights_only=True."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        fqn = read_item.dest_index.fqn
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def portable(exc: Exception) -> Exception:
    """`exc` if it survives pickling (DCP gathers every rank's error to the others), else a
    TransientError (for I/O errors) or PermanentError with the same message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        kind = TransientError if isinstance(exc, OSError | TransientError) else PermanentError
        return kind(f"{type(exc).__name__}: {exc}")
    return exc


def _reraise(exc: Exception) -> NoReturn:
    wrapped = portable(exc)
    if wrapped is exc:
        raise exc
    raise wrapped from exc


def _skip(f: Any, n: int) -> None:
    if n < 0:
        raise PermanentError("overlapping pieces in a sharded checkpoint")
    scratch = bytearray(min(n, 8 << 20))
    view = memoryview(scratch)
    while n > 0:
        got = f.readinto(view[: min(n, len(view))])
        if not got:
            raise PermanentError("a sharded checkpoint file ends early")
        n -= got


def _fill(f: Any, view: memoryview, uri: str, name: str) -> None:
    """Read exactly len(view) bytes into `view`, which nothing changes until the file is
    finished: the store's reader then hashes it behind the I/O (`readinto_stable`)."""
    readinto = getattr(f, "readinto_stable", None) or f.readinto
    got = 0
    while got < len(view):
        n = readinto(view[got:])
        if not n:
            raise PermanentError(f"{uri}/{name}: ends early")
        got += n


def _read_exact(f: Any, n: int, uri: str, name: str) -> bytes:
    buf = bytearray(n)
    _fill(f, memoryview(buf), uri, name)
    return bytes(buf)
