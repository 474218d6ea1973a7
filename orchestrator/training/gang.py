"""The ranks of a distributed job agreeing on what to do: small collectives on CPU.

`Gang.current()` (inside torch.distributed, after `init_process_group`) makes one gloo
process group of all ranks for the SDK's own messages, whatever backend the training uses
(NCCL's stream and the training's collectives stay untouched). Making it is a collective:
every rank constructs its `ResumableRun` at the same point of the script.

`agree(flags)` is the per-step notice agreement: an all-reduce (MAX) of a few small
integers, so a flag set on any rank is seen by all. `start_agree` issues it without
waiting, so that it runs while the next step computes; `Agreement.result()` collects it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True, slots=True)
class Agreement:
    """An all-reduce in flight; `result()` waits for it."""

    work: Any
    tensor: torch.Tensor

    def result(self) -> list[bool]:
        self.work.wait()
        return [bool(v) for v in self.tensor.tolist()]


@dataclass(frozen=True, slots=True)
class Gang:
    rank: int
    world_size: int
    group: Any  # torch.distributed.ProcessGroup (gloo)

    @staticmethod
    def current() -> Gang | None:
        """This process's gang, or None outside torch.distributed."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        group = dist.new_group(backend="gloo")
        return Gang(dist.get_rank(), dist.get_world_size(), group)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def start_agree(self, flags: Sequence[bool]) -> Agreement:
        tensor = torch.tensor([int(f) for f in flags], dtype=torch.int32)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return Agreement(work, tensor)

    def agree(self, flags: Sequence[bool]) -> list[bool]:
        """Each flag true on any rank, on every rank."""
        return self.start_agree(flags).result()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        box = [obj if self.is_leader else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0),
                                   group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.group)
