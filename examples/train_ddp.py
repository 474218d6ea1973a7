"""Example job: a small deterministic model trained data-parallel (DDP, or FSDP2 with
`--fsdp`), that survives preemption and a move to a machine with a different GPU count.

Run it under torchrun (gloo on CPU, NCCL on GPUs), on one node or several:

    HELIOTROPE_JOB_ID=ddp-1 HELIOTROPE_CHECKPOINT_URI=file:///tmp/ckpt \\
        torchrun --nproc-per-node 4 examples/train_ddp.py --steps 200

or as one plain process (no torch.distributed; the checkpoint is then a single file).
Every step trains on one global batch drawn from a generator seeded by (seed, step) and
cut into one slice per rank, so the data does not depend on the world size and the
averaged gradient is that of the whole batch: a run resumed on another number of ranks
continues the same optimization (equal up to float rounding). Dropout draws from each
rank's own torch generator, whose state is checkpointed per rank, so a run preempted and
resumed on the same shape ends bit-identical to one that never stopped.

The ResumableRun lines are all it takes (see docs/training.md). Rank 0 prints one line
per `--log-every` steps (the global mean loss) and, at the end,
`done steps=N loss=L params_sha256=H` with H the digest of the full (gathered) model
state; exit status 0 both when done and when preempted (after the checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.nn import functional

from orchestrator.training import ResumableRun, state_digest
from orchestrator.training.progress import report_progress

FEATURES = 16
CLASSES = 4


class Net(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(FEATURES, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, CLASSES),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


def global_batch(seed: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of `step`, the same whatever the world size: a fixed linear rule plus
    noise, from a generator seeded by (seed, step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, FEATURES, generator=g)
    w = torch.Generator().manual_seed(seed)
    rule = torch.randn(FEATURES, CLASSES, generator=w)
    y = (x @ rule + 0.5 * torch.randn(size, CLASSES, generator=g)).argmax(dim=1)
    return x, y


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model state on CPU, gathered from every rank (the same keys for DDP,
    FSDP2 and a plain module)."""
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=int(env.get("HELIOTROPE_TRAIN_STEPS", "200")))
    p.add_argument("--seed", type=int, default=int(env.get("HELIOTROPE_TRAIN_SEED", "0")))
    p.add_argument("--batch-size", type=int, default=64, help="global batch (all ranks)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--backend", default=None, help="nccl on CUDA, else gloo (default)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--every-steps", type=int, default=None)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--step-sleep-s",
        type=float,
        default=0.0,
        help="pause after each step (demos and tests pace the job with it)",
    )
    return p.parse_args(argv)


def parallel(net: Net, *, fsdp: bool, device: torch.device) -> nn.Module:
    """The model every rank trains: FSDP2 shards of `net`, or `net` under DDP."""
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in net.layers:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(net)
        return net
    # DDP regroups its gradient buckets after a process's first step, which changes the
    # float rounding of that one step after every restart; find_unused_parameters=True
    # keeps the first grouping (no rebuild), so a resumed run stays bit-identical.
    return nn.parallel.DistributedDataParallel(
        net,
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    torch.set_num_threads(args.threads)
    distributed = "RANK" in os.environ  # set by torchrun (or whatever launched the gang)
    cuda = torch.cuda.is_available()
    if distributed:
        backend = args.backend or ("nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(minutes=5))
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    if args.batch_size % world:
        raise SystemExit(
            f"--batch-size {args.batch_size} is not a multiple of the world size {world}"
        )
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    net = Net(args.hidden, args.dropout).to(device)
    model = parallel(net, fsdp=args.fsdp, device=device) if distributed else net
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    torch.manual_seed(args.seed * 7919 + rank)  # dropout: each rank its own stream

    per_rank = args.batch_size // world
    loss_value = float("nan")
    with ResumableRun(model, optimizer, every_steps=args.every_steps) as run:
        start = run.restore()
        if start:  # the state just restored, gathered (a collective: every rank calls it)
            restored = state_digest(full_state(model))
        if rank == 0:
            print(
                f"start step={start} of {args.steps} world={world} job={run.job_id}"
                + (
                    f" restored_world={run.restored_world_size} params_sha256={restored}"
                    if start
                    else ""
                ),
                flush=True,
            )
        model.train()
        for step in range(start, args.steps):
            x, y = global_batch(args.seed, step, args.batch_size)
            x = x[rank * per_rank : (rank + 1) * per_rank].to(device)
            y = y[rank * per_rank : (rank + 1) * per_rank].to(device)
            loss = functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                mean = loss.detach().clone()
                if distributed:
                    dist.all_reduce(mean)
                loss_value = mean.item() / world
                if rank == 0:
                    kept = run.last_checkpoint.step if run.last_checkpoint else 0
                    report_progress(step + 1, args.steps, checkpoint_step=kept)
                    print(f"step {step + 1}/{args.steps} loss {loss_value:.6f}", flush=True)
            run.step_done(step, {"step": step + 1})
            if args.step_sleep_s > 0:
                time.sleep(args.step_sleep_s)
        run.finish()
    digest = state_digest(full_state(model))
    if rank == 0:
        print(f"done steps={args.steps} loss={loss_value:.6f} params_sha256={digest}", flush=True)
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
