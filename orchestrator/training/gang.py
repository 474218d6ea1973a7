"""The ranks of a distributed job agreeing on what to do: small collectives on CPU.

`Gang.current()` (inside torch.distributed, after `init_process_group`) makes one gloo
process group of all ranks for the SDK's own messages, whatever backend the training uses
(NCCL's stream and the training's collectives stay untouched). Making it is a collective:
every rank constructs its `ResumableRun` at the same point of the script.

`agree(values)` is the notice agreement: an all-reduce (MAX) of a few small integers, so
a flag set on any rank is seen by all (and a number only rank 0 sets reaches all).
`start_agree` issues it without waiting, so that it runs while the next step computes;
`Agreement.result()` collects it.
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

    def result(self) -> list[int]:
        self.work.wait()
        return [int(v) for v in self.tensor.tolist()]


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

    def start_agree(self, values: Sequence[int | bool]) -> Agreement:
        tensor = torch.tensor([int(v) for v in values], dtype=torch.int64)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return Agreement(work, tensor)

    def agree(self, values: Sequence[int | bool]) -> list[int]:
        """The largest of each value over all ranks (a flag: true on any rank), on every
        rank."""
        return self.start_agree(values).result()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        box = [obj if self.is_leader else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self.group)
