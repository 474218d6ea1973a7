"""Stream a tree of torch state (state dicts, RNG states, plain values) to a file and back.

Format "heliotrope-state/1"::

    b"HTSTATE1" | u64 little-endian header length | header | tensor bytes, in tree order

The header is `torch.save` of the tree with every tensor replaced by a meta tensor of the
same dtype and shape (so it is small, and is read back with `weights_only=True`: no
arbitrary pickle from storage). The tensor bytes follow, raw and contiguous. Writing hands
tensor memory straight to the sink (no serialization copy); reading allocates each tensor
once and fills it with `readinto`. Both stream, so a checkpoint is never held twice in
memory, and the sink/source can hash on the fly (see `orchestrator.checkpoints.hashio`).

Supported leaves: dense tensors of any dtype on any device (saved from CPU memory, loaded
on CPU), and what `torch.load(weights_only=True)` accepts: None, bool, int, float, str,
bytes, and dict / OrderedDict / list / tuple of those. Numpy arrays are not supported:
convert them (e.g. `.tolist()`).
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import torch

from orchestrator.errors import InputError, PermanentError

MAGIC: Final = b"HTSTATE1"
FORMAT: Final = "heliotrope-state/1"
_CHUNK: Final = 32 << 20


class Sink(Protocol):
    def write(self, data: bytes | bytearray | memoryview, /) -> int | None: ...


class Source(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...
    def readinto(self, buffer: bytearray | memoryview, /) -> int: ...


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
        raise InputError("checkpoint state", "tensor", "a dense (strided) tensor",
                         got=f"{t.layout} quantized={t.is_quantized}")


def save_state(tree: Any, sink: Sink) -> int:
    """Write `tree` to `sink`; returns the bytes written."""
    tensors: list[torch.Tensor] = []

    def to_meta(t: torch.Tensor) -> torch.Tensor:
        _check_dense(t)
        tensors.append(t)
        return torch.empty(t.shape, dtype=t.dtype, device="meta")

    skeleton = map_tensors(tree, to_meta)
    header = io.BytesIO()
    torch.save(skeleton, header)
    head = header.getvalue()
    sink.write(MAGIC + struct.pack("<Q", len(head)) + head)
    written = len(MAGIC) + 8 + len(head)
    for t in tensors:
        data = t.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        data = data.contiguous()
        view = byte_view(data)
        for start in range(0, len(view), _CHUNK):
            sink.write(view[start : start + _CHUNK])
        written += len(view)
    return written


def load_state(source: Source) -> Any:
    """Read a tree written by `save_state`; tensors come back contiguous, on CPU."""
    lead = _read_exact(source, len(MAGIC) + 8)
    if lead[: len(MAGIC)] != MAGIC:
        raise PermanentError(f"not a {FORMAT} stream (starts with {lead[:8]!r})")
    (head_len,) = struct.unpack("<Q", lead[len(MAGIC) :])
    skeleton = torch.load(io.BytesIO(_read_exact(source, head_len)), weights_only=True)

    def fill(meta: torch.Tensor) -> torch.Tensor:
        t = torch.empty(meta.shape, dtype=meta.dtype)
        view = byte_view(t)
        got = 0
        while got < len(view):
            n = source.readinto(view[got:])
            if not n:
                raise PermanentError(f"{FORMAT} stream ends inside a tensor")
            got += n
        return t

    tree = map_tensors(skeleton, fill)
    if source.read(1):
        raise PermanentError(f"{FORMAT} stream has bytes after its last tensor")
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
