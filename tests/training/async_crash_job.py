"""A small DDP job for test_async_crash.py, one process per rank (torchrun's environment):
async sharded checkpoints every `--every-steps` into a real file store, except that the
save of `--stall-step` stops half way through each rank's first file and never ends (a
machine dying mid-save: the test then kills every rank with SIGKILL). Each rank touches
`$STALL_MARKERS/stalled-<rank>` when its save stalls. Rank 0 prints `start step=S ...`,
`step N/M` after each step and `done steps=N loss=L params_sha256=H` at the end, as
examples/train_ddp.py does.

    python -m tests.training.async_crash_job --steps 16 [--stall-step 8]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orchestrator.checkpoints import CheckpointStore, FileEntry, WriteFn
from orchestrator.training import ResumableRun, state_digest


class StallingStore(CheckpointStore):
    """A file store whose writes of one step hang half way through a file, forever."""

    def __init__(self, root: str, *, stall_step: int, marker: Path) -> None:
        super().__init__(root)
        self.stall_step = stall_step
        self.marker = marker

    def write_part(
        self, job_id: str, step: int, files: Callable[[WriteFn], None]
    ) -> dict[str, FileEntry]:
        if step != self.stall_step:
            return super().write_part(job_id, step, files)

        def stalling(write_fn: WriteFn) -> None:
            @contextmanager
            def opened(name: str) -> Iterator[Any]:
                with write_fn(name) as out:
                    yield _HalfThenHang(out, self.marker)

            files(opened)

        return super().write_part(job_id, step, stalling)


class _HalfThenHang:
    def __init__(self, out: Any, marker: Path) -> None:
        self.out = out
        self.marker = marker

    def write(self, data: Any) -> None:
        self._hang(data, self.out.write)

    def write_stable(self, data: Any) -> None:
        self._hang(data, self.out.write_stable)

    def _hang(self, data: Any, write: Callable[[Any], Any]) -> None:
        view = memoryview(data).cast("B")
        write(view[: len(view) // 2])
        self.marker.write_text("stalled\n")
        while True:
            time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--stall-step", type=int, default=-1)
    p.add_argument("--every-steps", type=int, default=4)
    p.add_argument("--step-sleep-s", type=float, default=0.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    model = nn.parallel.DistributedDataParallel(net, find_unused_parameters=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    store = StallingStore(
        os.environ["HELIOTROPE_CHECKPOINT_URI"],
        stall_step=args.stall_step,
        marker=Path(os.environ.get("STALL_MARKERS", ".")) / f"stalled-{rank}",
    )
    loss = torch.zeros(())
    with ResumableRun(
        model, optimizer, store=store, every_steps=args.every_steps, async_checkpoint=True
    ) as run:
        start = run.restore()
        if rank == 0:
            print(f"start step={start} of {args.steps} world={world} job={run.job_id}", flush=True)
        for step in range(start, args.steps):
            g = torch.Generator().manual_seed(step)
            x = torch.randn(8 * world, 8, generator=g)[rank * 8 : (rank + 1) * 8]
            loss = model(x).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            run.step_done(step, {"step": step + 1})
            if rank == 0:
                print(f"step {step + 1}/{args.steps}", flush=True)
            if args.step_sleep_s > 0:
                time.sleep(args.step_sleep_s)
        run.finish()
    if rank == 0:
        digest = state_digest(net)
        print(f"done steps={args.steps} loss={loss.item():.6f} params_sha256={digest}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
