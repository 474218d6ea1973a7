"""The manifest: the one file that makes a checkpoint directory a checkpoint.

It is written last, under a temporary name and then renamed into place, so a reader sees
either no manifest (an incomplete, invisible directory) or a whole one. It lists every file
of the checkpoint with its size and the sha256 of each of its chunks: the file cut into
`chunk_bytes` pieces (the last one shorter; an empty file has one empty chunk), so every
byte is covered by exactly one digest and the chunks hash and verify on several cores at
once. The sha256 of the manifest's own bytes is the checkpoint's identity
(`CheckpointRef.manifest_sha256`), the same in every store it is copied to, because copies
carry the manifest byte for byte.

Version 2 (written)::

    "files": {"state": {"size_bytes": 40000000, "chunk_bytes": 16777216,
                        "sha256": ["<chunk 0>", "<chunk 1>", "<chunk 2>"]}}

Version 1 (still read) had one sha256 of the whole file: `"sha256": "<hex>"`; it is read as
a single chunk as long as the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.errors import InputError

FORMAT: Final = "heliotrope-checkpoint"
VERSION: Final = 2
READ_VERSIONS: Final = (1, 2)
CHUNK_BYTES: Final = 16 << 20
"""Default chunk size: 64 digests per GiB; large enough that hashing one costs far more
than handing it to another thread."""
MAX_CHUNK_BYTES: Final = 1 << 40
MANIFEST_NAME: Final = "manifest.json"

_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A file of a checkpoint: its size and the sha256 of each `chunk_bytes` piece, in order
    (`chunk_count(size_bytes, chunk_bytes)` digests)."""

    size_bytes: int
    chunk_bytes: int
    sha256: tuple[str, ...]

    def chunk_range(self, index: int) -> tuple[int, int]:
        """Byte offsets [start, end) of chunk `index`."""
        start = index * self.chunk_bytes
        return start, min(start + self.chunk_bytes, self.size_bytes)


def chunk_count(size_bytes: int, chunk_bytes: int) -> int:
    """Digests of a file of `size_bytes`: one per started chunk, and one for an empty file."""
    return max(1, -(-size_bytes // chunk_bytes))


@dataclass(frozen=True, slots=True)
class Manifest:
    job_id: str
    step: int
    created_at_s: float
    files: Mapping[str, FileEntry]
    metadata: Mapping[str, str] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self.files.values())

    def encode(self) -> bytes:
        body = {
            "format": FORMAT,
            "version": VERSION,
            "job_id": self.job_id,
            "step": self.step,
            "created_at_s": self.created_at_s,
            "files": {
                name: {
                    "size_bytes": e.size_bytes,
                    "chunk_bytes": e.chunk_bytes,
                    "sha256": list(e.sha256),
                }
                for name, e in sorted(self.files.items())
            },
            "metadata": dict(sorted(self.metadata.items())),
        }
        return (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def decode(data: bytes) -> Manifest:
    """Parse manifest bytes; raises ValueError (with what is wrong) on anything unexpected."""
    try:
        body = json.loads(data.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    version = body.get("version")
    if body.get("format") != FORMAT or version not in READ_VERSIONS or isinstance(version, bool):
        raise ValueError(
            f"format {body.get('format')!r} version {version!r}, "
            f"expected {FORMAT!r} version {' or '.join(map(str, READ_VERSIONS))}"
        )
    job_id, step, created = body.get("job_id"), body.get("step"), body.get("created_at_s")
    files, metadata = body.get("files"), body.get("metadata", {})
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise ValueError(f"bad job_id {job_id!r}")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"bad step {step!r}")
    if (
        not isinstance(created, int | float)
        or isinstance(created, bool)
        or not math.isfinite(created)
    ):
        raise ValueError(f"bad created_at_s {created!r}")
    if not isinstance(files, dict) or not files:
        raise ValueError("no files listed")
    entries: dict[str, FileEntry] = {}
    for name, raw in files.items():
        check_file_name(name, where="manifest")
        if not isinstance(raw, dict):
            raise ValueError(f"file {name!r}: not an object")
        entries[name] = _decode_entry(name, raw, version)
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError("metadata must map strings to strings")
    return Manifest(job_id, step, float(created), entries, dict(metadata))


def _decode_entry(name: str, raw: dict[str, Any], version: int) -> FileEntry:
    size, digests = raw.get("size_bytes"), raw.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"file {name!r}: bad size_bytes {size!r}")
    if version == 1:  # one digest of the whole file: a single chunk
        if not isinstance(digests, str) or not _SHA256.match(digests):
            raise ValueError(f"file {name!r}: bad sha256 {digests!r}")
        return FileEntry(size, max(size, 1), (digests,))
    chunk = raw.get("chunk_bytes")
    if not isinstance(chunk, int) or isinstance(chunk, bool) or not 0 < chunk <= MAX_CHUNK_BYTES:
        raise ValueError(f"file {name!r}: bad chunk_bytes {chunk!r}")
    if not isinstance(digests, list) or not all(
        isinstance(d, str) and _SHA256.match(d) for d in digests
    ):
        raise ValueError(f"file {name!r}: sha256 must be a list of sha256 hex digests")
    if len(digests) != chunk_count(size, chunk):
        raise ValueError(
            f"file {name!r}: {len(digests)} chunk digests for {size} bytes in chunks of "
            f"{chunk} (expected {chunk_count(size, chunk)})"
        )
    return FileEntry(size, chunk, tuple(digests))


def check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        raise InputError(
            "checkpoint store",
            "job_id",
            "1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit",
            got=repr(job_id),
        )
    return job_id


def check_step(step: object) -> int:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**12:
        raise InputError("checkpoint store", "step", "an integer in [0, 10**12)", got=repr(step))
    return step


def check_file_name(name: object, *, where: str = "checkpoint store") -> str:
    """A relative name of '/'-separated segments of letters, digits, '.', '_', '-'; segments
    never start with '.' (those names are the store's own temporary files)."""
    ok = (
        isinstance(name, str)
        and name != MANIFEST_NAME
        and all(_SEGMENT.match(seg) for seg in name.split("/"))
    )
    if not ok:
        if where == "manifest":
            raise ValueError(f"bad file name {name!r}")
        raise InputError(
            where,
            "file name",
            "a relative path of segments made of letters, digits, '.', '_' or '-' "
            f"(not starting with '.'), other than {MANIFEST_NAME!r}",
            got=repr(name),
        )
    assert isinstance(name, str)
    return name


def as_str_dict(values: Mapping[str, Any] | None) -> dict[str, str]:
    if values is None:
        return {}
    out: dict[str, str] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InputError(
                "checkpoint store",
                "metadata",
                "a mapping of strings to strings",
                got=f"{key!r}: {value!r}",
            )
        out[key] = value
    return out
