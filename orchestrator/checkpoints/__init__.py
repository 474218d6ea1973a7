"""Checkpoint stores: atomic, verifiable, copyable checkpoints over fsspec.

A checkpoint is a directory of files plus a manifest (sizes, and the sha256 of every 16 MiB
chunk of every file) written last; see `store` for the layout and the invariants. Pure
fsspec: no torch here (the training SDK, `orchestrator.training`, serializes torch state
into these files).

    store = CheckpointStore("file:///data/ckpt")           # or memory://, s3://, gs://
    ref = store.write("job-1", 100, {"state": blob}, now_s=time.time())
    ref = store.latest("job-1")                            # newest that verifies
    copy = store.copy(ref, CheckpointStore("s3://b/ckpt"), request_id="mig-7/copy")
"""

from orchestrator.checkpoints.errors import CheckpointExists, CorruptCheckpoint
from orchestrator.checkpoints.hashio import CheckpointReader, FileWriter
from orchestrator.checkpoints.manifest import FileEntry, Manifest
from orchestrator.checkpoints.store import (
    CheckpointRef,
    CheckpointStore,
    Progress,
    WriteFn,
    step_dir_name,
)

__all__ = [
    "CheckpointExists",
    "CheckpointReader",
    "CheckpointRef",
    "CheckpointStore",
    "CorruptCheckpoint",
    "FileEntry",
    "FileWriter",
    "Manifest",
    "Progress",
    "WriteFn",
    "step_dir_name",
]
