"""The training SDK: what a training script imports to be checkpointed, moved and preempted.

Importable with torch and the standard library only (plus fsspec for the checkpoint store,
and numpy if present for its RNG): never Airflow, cloud SDKs, SQLAlchemy or pandas.

    from orchestrator.training import ResumableRun

The same on every rank of a DDP/FSDP job (sharded checkpoints, notices agreed by all
ranks): see docs/training.md.
"""

from orchestrator.training.notices import (
    AwsSpotNotices,
    FileNotices,
    GceNotices,
    NoticeSource,
    NoticeWatcher,
    PreemptionNotice,
    notice_source_from_env,
)
from orchestrator.training.rng import capture_rng, restore_rng
from orchestrator.training.run import STATE_FILE, ResumableRun
from orchestrator.training.shard_layout import SHARDED_FORMAT
from orchestrator.training.state_io import (
    load_state,
    load_state_files,
    save_state,
    save_state_files,
    state_digest,
)

__all__ = [
    "SHARDED_FORMAT",
    "STATE_FILE",
    "AwsSpotNotices",
    "FileNotices",
    "GceNotices",
    "NoticeSource",
    "NoticeWatcher",
    "PreemptionNotice",
    "ResumableRun",
    "capture_rng",
    "load_state",
    "load_state_files",
    "notice_source_from_env",
    "restore_rng",
    "save_state",
    "save_state_files",
    "state_digest",
]
