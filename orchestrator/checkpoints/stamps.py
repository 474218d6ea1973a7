"""Verification stamps: a load skips re-hashing files unchanged since their hashes were checked.

Every byte of a checkpoint is hashed when it is written (the manifest's digests are of the
bytes handed to the writer) and re-hashed by `verify` (so also when a copy is verified at
its destination). A local store then records, next to the manifest, one stamp per file:
what `stat` says of it (size, mtime_ns, ctime_ns, inode, device) at the time its hashes
were known good, for that manifest (its sha256), on this machine since its last boot::

    <step dir>/.verified.json   {"manifest_sha256": ..., "boot_id": ..., "files": {...}}

A verifying read (`CheckpointStore.open_file`, `read`: what a training job's restore does)
of a file whose `stat` still equals its stamp reads it without hashing; anything else (no
stamp, another manifest, another machine or boot, any field different) reads it with the
full check. `verify` and copies always re-hash every byte.

Why a match means the bytes are the verified ones: any write to a file moves its ctime
(which a user cannot set back) and mtime, and a replaced file has another inode. The one
gap is the filesystem's timestamp granularity (a few ms): a write in the same tick as the
stamp could keep both times. As git does for its index ("racy git"), a stamp is trusted
only for files whose ctime and mtime are strictly older than the stamp file itself; a file
changed in the same tick as its stamp is re-hashed. Limits, by design: bit rot on disk that
changes no metadata, or a write that resets the clock, is not seen by a stamped read; it is
caught by `verify` (which `latest` and `retain` run) and by every copy. A reboot drops every
stamp (the boot id), so a crash can never leave a stamp of bytes that did not reach disk.

Stamps are an optimisation only: one that cannot be written (a read-only store) or read
(torn, garbage) just means the full check.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from functools import cache
from typing import Final

logger = logging.getLogger(__name__)

STAMP_NAME: Final = ".verified.json"
_BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True, slots=True)
class FileStamp:
    size_bytes: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


@cache
def boot_id() -> str | None:
    """This machine's boot (Linux); None where there is none to read: then no stamps."""
    try:
        with open(_BOOT_ID, encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def stat_files(directory: str, names: Iterable[str]) -> dict[str, FileStamp]:
    """The stamps of `names` now (a file that cannot be stat'ed is left out)."""
    out: dict[str, FileStamp] = {}
    for name in names:
        try:
            out[name] = FileStamp.of(os.stat(f"{directory}/{name}"))
        except OSError:
            continue
    return out


def record(directory: str, manifest_sha256: str, stamps: Mapping[str, FileStamp]) -> None:
    """Write the stamps of a checkpoint whose files were just found good (atomically, by
    rename; not fsynced: a stamp lost in a crash only costs a full check, and a reboot
    voids it anyway). Best effort."""
    boot = boot_id()
    if boot is None or not stamps:
        return
    body = {
        "manifest_sha256": manifest_sha256,
        "boot_id": boot,
        "files": {
            name: [s.size_bytes, s.mtime_ns, s.ctime_ns, s.inode, s.device]
            for name, s in sorted(stamps.items())
        },
    }
    tmp = f"{directory}/.{STAMP_NAME}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, f"{directory}/{STAMP_NAME}")
    except OSError as exc:
        logger.debug("no verification stamp for %s: %s", directory, exc)
        with suppress(OSError):
            os.unlink(tmp)


def load(directory: str, manifest_sha256: str) -> dict[str, FileStamp]:
    """The stamps a read may trust: those of this manifest, this boot, and of files whose
    ctime and mtime are older than the stamp file (see the module docstring); {} if none."""
    boot = boot_id()
    if boot is None:
        return {}
    try:
        with open(f"{directory}/{STAMP_NAME}", "rb") as f:
            written_ns = os.fstat(f.fileno()).st_mtime_ns
            body = json.loads(f.read())
        if body.get("manifest_sha256") != manifest_sha256 or body.get("boot_id") != boot:
            return {}
        stamps = {
            str(name): FileStamp(*(int(v) for v in fields))
            for name, fields in body["files"].items()
        }
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return {}
    return {
        name: s for name, s in stamps.items() if s.ctime_ns < written_ns and s.mtime_ns < written_ns
    }
