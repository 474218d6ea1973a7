"""Write a tree of torch state (state dicts, RNG states, plain values) to files and back.

Format "heliotrope-state/1". The header file (or the start of a single stream)::

    b"HTSTATE1" | u64 little-endian header length | header

The header is `torch.save` of {"skeleton": the tree with every tensor replaced by a meta
tensor of the same dtype and shape, "shards": names of the data files, "shard_bytes",
"total_bytes"}: small, and read back with `weights_only=True` (no arbitrary pickle from
storage). The tensor bytes, raw and contiguous in tree order, form one virtual stream of
`total_bytes`: either inline after the header (`save_state`, one stream, no shards) or cut
into shard files of `shard_bytes` each (`save_state_files`), written and read by several
threads at once, so hashing and I/O use more than one core and object stores get parallel
streams.

Writing hands tensor memory straight to the file (no serialization copy); reading
allocates each tensor once and fills it with `readinto`. Nothing is held twice in memory,
and the files can hash on the fly (see `orchestrator.checkpoints.hashio`): files that offer
`write_stable` / `readinto_stable` get those, as the tensor memory stays unchanged until the
file is closed, so hashing runs behind the I/O without stalling it.

Supported leaves: dense tensors of any dtype on any device (saved from CPU memory, loaded
on CPU), and what `torch.load(weights_only=True)` accepts: None, bool, int, float, str,
bytes, and dict / OrderedDict / list / tuple of those. Numpy arrays are not supported:
convert them (e.g. `.tolist()`).
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Final, Protocol

import torch

from orchestrator.errors import InputError, PermanentError

MAGIC: Final = b"HTSTATE1"
FORMAT: Final = "heliotrope-state/1"
SHARD_BYTES: Final = 256 << 20
THREADS: Final = max(2, min(8, os.cpu_count() or 1))
_MAX_HEADER_BYTES: Final = 1 << 30
_CHUNK: Final = 32 << 20


class Sink(Protocol):
    def write(self, data: bytes | bytearray | memoryview, /) -> int | None: ...


class Source(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...
    def readinto(self, buffer: bytearray | memoryview, /) -> int: ...


def _stable_write(sink: Sink) -> Callable[[memoryview], object]:
    """`sink.write_stable` where offered (the buffer stays unchanged until the file is
    closed, so its hashing need not finish first), else `sink.write`."""
    write: Callable[[memoryview], object] | None = getattr(sink, "write_stable", None)
    return write if write is not None else sink.write


def _stable_readinto(source: Source) -> Callable[[memoryview], int]:
    """`source.readinto_stable` where offered (the tensor is not touched before the file
    is finished and verified), else `source.readinto`."""
    readinto: Callable[[memoryview], int] | None = getattr(source, "readinto_stable", None)
    return readinto if readinto is not None else source.readinto


def map_tensors(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Rebuild `tree` with `fn` applied to every tensor, visiting in a fixed order (dict
    insertion order, list order). Keeps OrderedDict and its `_metadata` (state dicts)."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, OrderedDict):
        out: OrderedDict[Any, Any] = OrderedDict((k, map_tensors(v, fn)) for k, v in tree.items())
        meta = getattr(tree, "_metadata", None)
        if meta is not None:
            out._metadata = meta  # type: ignore[attr-defined]
        return out
    if isinstance(tree, dict):
        return {k: map_tensors(v, fn) for k, v in tree.items()}
    if isinstance(tree, list):
        return [map_tensors(v, fn) for v in tree]
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return tuple(map_tensors(v, fn) for v in tree)
    return tree


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy. Keep `t` alive while in use."""
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    array = (ctypes.c_ubyte * nbytes).from_address(t.data_ptr())
    return memoryview(array).cast("B")


def _check_dense(t: torch.Tensor) -> None:
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        raise InputError(
            "checkpoint state",
            "tensor",
            "a dense (strided) tensor",
            got=f"{t.layout} quantized={t.is_quantized}",
        )


OpenSink = Callable[[str], AbstractContextManager[Sink]]
OpenSource = Callable[[str], AbstractContextManager[Source]]


def _flatten(tree: Any) -> tuple[Any, list[torch.Tensor]]:
    """The skeleton (tensors -> meta tensors) and the tensors as contiguous CPU tensors."""
    tensors: list[torch.Tensor] = []

    def to_meta(t: torch.Tensor) -> torch.Tensor:
        _check_dense(t)
        data = t.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        tensors.append(data.contiguous())
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    return map_tensors(tree, to_meta), tensors


def _header(skeleton: Any, shards: list[str], shard_bytes: int, total: int) -> bytes:
    buf = io.BytesIO()
    torch.save(
        {"skeleton": skeleton, "shards": shards, "shard_bytes": shard_bytes, "total_bytes": total},
        buf,
    )
    head = buf.getvalue()
    return MAGIC + struct.pack("<Q", len(head)) + head


def _read_header(source: Source) -> dict[str, Any]:
    lead = _read_exact(source, len(MAGIC) + 8)
    if lead[: len(MAGIC)] != MAGIC:
        raise PermanentError(f"not a {FORMAT} stream (starts with {lead[:8]!r})")
    (head_len,) = struct.unpack("<Q", lead[len(MAGIC) :])
    if head_len > _MAX_HEADER_BYTES:
        raise PermanentError(f"{FORMAT} header of {head_len} bytes: damaged")
    header = torch.load(io.BytesIO(_read_exact(source, head_len)), weights_only=True)
    if (
        not isinstance(header, dict)
        or not {"skeleton", "shards", "shard_bytes", "total_bytes"} <= header.keys()
    ):
        raise PermanentError(f"{FORMAT} header is not readable")
    return header


def _views(tensors: list[torch.Tensor]) -> list[memoryview]:
    return [byte_view(t) for t in tensors]


def _slices(views: list[memoryview], start: int, end: int) -> Iterator[memoryview]:
    """The pieces of the virtual stream [start, end) of the concatenated `views`."""
    offset = 0
    for view in views:
        lo, hi = max(start, offset), min(end, offset + len(view))
        if lo < hi:
            yield view[lo - offset : hi - offset]
        offset += len(view)
        if offset >= end:
            return


def _fill(readinto: Callable[[memoryview], int], target: memoryview) -> None:
    got = 0
    while got < len(target):
        n = readinto(target[got:])
        if not n:
            raise PermanentError(f"{FORMAT} data ends early")
        got += n


def _allocate(skeleton: Any) -> tuple[Any, list[torch.Tensor]]:
    tensors: list[torch.Tensor] = []

    def alloc(meta: torch.Tensor) -> torch.Tensor:
        t = torch.empty(meta.shape, dtype=meta.dtype)
        tensors.append(t)
        return t

    return map_tensors(skeleton, alloc), tensors


def _parallel(jobs: list[Callable[[], None]], threads: int) -> None:
    if len(jobs) <= 1 or threads <= 1:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(
        max_workers=min(threads, len(jobs)), thread_name_prefix="state-io"
    ) as pool:
        futures = [pool.submit(job) for job in jobs]
        for future in futures:
            future.result()


def save_state(tree: Any, sink: Sink) -> int:
    """Write `tree` to one stream (header, then the tensor bytes); returns bytes written."""
    skeleton, tensors = _flatten(tree)
    views = _views(tensors)
    total = sum(len(v) for v in views)
    head = _header(skeleton, [], 0, total)
    sink.write(head)
    for view in views:
        for start in range(0, len(view), _CHUNK):
            sink.write(view[start : start + _CHUNK])
    return len(head) + total


def load_state(source: Source) -> Any:
    """Read a tree written by `save_state`; tensors come back contiguous, on CPU."""
    header = _read_header(source)
    if header["shards"]:
        raise PermanentError(f"{FORMAT}: sharded state; read it with load_state_files")
    tree, tensors = _allocate(header["skeleton"])
    for view in _views(tensors):
        _fill(source.readinto, view)
    if source.read(1):
        raise PermanentError(f"{FORMAT} stream has bytes after its last tensor")
    return tree


def save_state_files(
    tree: Any,
    open_file: OpenSink,
    *,
    name: str = "state",
    shard_bytes: int = SHARD_BYTES,
    threads: int = THREADS,
) -> int:
    """Write `tree` as the header file `name` plus shard files `name.0000`, ... of
    `shard_bytes` each, `threads` at a time. Returns the bytes written."""
    if shard_bytes <= 0:
        raise InputError("save_state_files", "shard_bytes", "> 0", got=shard_bytes)
    skeleton, tensors = _flatten(tree)
    views = _views(tensors)
    total = sum(len(v) for v in views)
    count = -(-total // shard_bytes)
    shards = [f"{name}.{k:04d}" for k in range(count)]
    head = _header(skeleton, shards, shard_bytes, total)
    with open_file(name) as out:
        out.write(head)

    def write_shard(k: int) -> Callable[[], None]:
        def job() -> None:
            with open_file(shards[k]) as out:
                write = _stable_write(out)
                for piece in _slices(views, k * shard_bytes, min((k + 1) * shard_bytes, total)):
                    write(piece)

        return job

    _parallel([write_shard(k) for k in range(count)], threads)
    return len(head) + total


def load_state_files(open_file: OpenSource, *, name: str = "state", threads: int = THREADS) -> Any:
    """Read a tree written by `save_state_files` (or `save_state` into the file `name`)."""
    with open_file(name) as src:
        header = _read_header(src)
        shards: list[str] = header["shards"]
        tree, tensors = _allocate(header["skeleton"])
        views = _views(tensors)
        total = sum(len(v) for v in views)
        if total != header["total_bytes"]:
            raise PermanentError(f"{FORMAT} header disagrees with itself about its size")
        if not shards:  # a single stream
            readinto = _stable_readinto(src)
            for view in views:
                _fill(readinto, view)
        if src.read(1):
            raise PermanentError(f"{FORMAT} file {name} has bytes after its end")
    shard_bytes = int(header["shard_bytes"])
    if shards and (shard_bytes <= 0 or len(shards) != -(-total // shard_bytes)):
        raise PermanentError(f"{FORMAT} header lists {len(shards)} shards for {total} bytes")

    def read_shard(k: int) -> Callable[[], None]:
        def job() -> None:
            with open_file(shards[k]) as src:
                readinto = _stable_readinto(src)
                for piece in _slices(views, k * shard_bytes, min((k + 1) * shard_bytes, total)):
                    _fill(readinto, piece)
                if src.read(1):
                    raise PermanentError(f"{FORMAT} shard {shards[k]} is longer than listed")

        return job

    _parallel([read_shard(k) for k in range(len(shards))], threads)
    return tree


def _read_exact(source: Source, n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    while left:
        data = source.read(left)
        if not data:
            raise PermanentError(f"{FORMAT} stream ends early")
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def state_digest(state: Any) -> str:
    """sha256 over every tensor of `state` (a module's state dict, or any tree): names,
    dtypes, shapes and bytes, in a fixed order. Equal digests mean bit-identical tensors."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    sha = hashlib.sha256()
    index = 0

    def add(t: torch.Tensor) -> torch.Tensor:
        nonlocal index
        data = t.detach().cpu().contiguous()
        sha.update(f"{index}:{data.dtype}:{tuple(data.shape)};".encode())
        sha.update(byte_view(data))
        index += 1
        return t

    def walk(tree: Any) -> None:
        if isinstance(tree, Mapping):
            for key in sorted(tree, key=str):
                sha.update(f"[{key}]".encode())
                walk(tree[key])
        else:
            map_tensors(tree, add)

    walk(state)
    return sha.hexdigest()
