"""The file names of a sharded checkpoint (see `orchestrator.training.sharded`), apart from
DCP itself so that single-process scripts need not import torch.distributed.checkpoint."""

from __future__ import annotations

from typing import Final

SHARDED_FORMAT: Final = "heliotrope-dcp/1"
METADATA_FILE: Final = "dcp-metadata"


def shard_file(rank: int) -> str:
    """The DCP pieces one rank wrote, as raw tensor bytes."""
    return f"shard-r{rank:05d}"


def rank_file(rank: int) -> str:
    """One rank's RNG states, data state and scheduler (a `state_io` file)."""
    return f"rank-r{rank:05d}"
