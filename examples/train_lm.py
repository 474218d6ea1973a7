"""Example job: a tiny character-level transformer language model that survives every move.

It trains on text every machine has offline: a few of Python's own standard-library
sources, read in a fixed order. Everything random comes from seeded generators whose
state is checkpointed (torch: init and dropout; numpy: token noise; `random`: window
jitter; the data order from the epoch number), so a run that is preempted, moved between
stores and resumed any number of times ends bit-identical to one that never stopped.

    HELIOTROPE_JOB_ID=lm-1 HELIOTROPE_CHECKPOINT_URI=file:///tmp/ckpt \\
        python examples/train_lm.py --steps 200 --seed 0

It trains on the GPU when there is one (`--cpu` to stay on the CPU), else on the CPU.
This is what the local provider launches as an "instance". It prints one progress line per
`--log-every` steps and, at the end, `done steps=N loss=L params_sha256=H`; exit status 0
both when done and when preempted (after writing its checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from orchestrator.training import ResumableRun, state_digest
from orchestrator.training.progress import report_progress

# Read in this order; missing ones (other Python builds) are skipped.
CORPUS_FILES = (
    "textwrap.py",
    "string/__init__.py",
    "string.py",
    "bisect.py",
    "colorsys.py",
    "heapq.py",
    "shlex.py",
    "fnmatch.py",
    "glob.py",
    "abc.py",
    "keyword.py",
    "this.py",
)
VOCAB = 256  # bytes


def corpus(max_bytes: int) -> bytes:
    """Up to `max_bytes` of standard-library source, the same bytes every time."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = [n for n in CORPUS_FILES if (root / n).is_file()]
    if not names:  # an unusual layout: fall back to a fixed sorted listing
        names = sorted(p.name for p in root.glob("*.py"))[:20]
    text = b"\n".join((root / n).read_bytes() for n in names)
    if len(text) < 4096:
        raise SystemExit(f"too little text under {root}: {len(text)} bytes")
    return text[:max_bytes]


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = self.drop(att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyLM(nn.Module):
    def __init__(
        self, *, context: int, d_model: int, layers: int, heads: int, dropout: float
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)
        self.drop = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x))


class Batches:
    """Windows of the corpus in a per-epoch permuted order; `state` is the position."""

    def __init__(self, data: torch.Tensor, *, context: int, batch: int, seed: int) -> None:
        self.data, self.context, self.batch, self.seed = data, context, batch, seed
        self.windows = (len(data) - 2 * context) // context
        if self.windows < batch:
            raise SystemExit("corpus too small for this context and batch size")

    def next(self, state: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, dict[str, int]]:
        epoch, position = state["epoch"], state["position"]
        if position + self.batch > self.windows:
            epoch, position = epoch + 1, 0
        order = np.random.default_rng([self.seed, epoch]).permutation(self.windows)
        picks = order[position : position + self.batch]
        jitter = [random.randrange(self.context // 2) for _ in picks]  # python RNG
        starts = [int(p) * self.context + j for p, j in zip(picks, jitter, strict=True)]
        x = torch.stack([self.data[s : s + self.context] for s in starts])
        y = torch.stack([self.data[s + 1 : s + 1 + self.context] for s in starts])
        noise = torch.from_numpy(np.random.random(x.shape) < 0.02)  # numpy RNG
        x = torch.where(noise, torch.full_like(x, ord("?")), x)
        return x, y, {"epoch": epoch, "position": position + self.batch}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--steps",
        type=int,
        default=int(env.get("HELIOTROPE_TRAIN_STEPS", "200")),
        help="optimizer steps in all (env HELIOTROPE_TRAIN_STEPS)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=int(env.get("HELIOTROPE_TRAIN_SEED", "0")),
        help="seed of everything random (env HELIOTROPE_TRAIN_SEED)",
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--corpus-bytes", type=int, default=200_000)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (fixed so results do not depend on the machine)",
    )
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU")
    p.add_argument(
        "--deterministic-algorithms",
        action="store_true",
        help="torch.use_deterministic_algorithms (for GPUs; costs ~2 s of imports)",
    )
    p.add_argument(
        "--every-steps",
        type=int,
        default=None,
        help="checkpoint cadence (else HELIOTROPE_CHECKPOINT_EVERY_STEPS/MINUTES)",
    )
    p.add_argument("--async-checkpoint", action="store_true", default=None)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument(
        "--step-sleep-s",
        type=float,
        default=0.0,
        help="pause after each step (demos and tests pace the job with it)",
    )
    p.add_argument(
        "--step-time-s",
        type=float,
        default=0.0,
        help="run the steps on a schedule of this many seconds each, a slow step made up "
        "by the next ones (the demo: the same progress however busy the machine is)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    torch.set_num_threads(args.threads)
    if args.deterministic_algorithms:  # on CPU the ops used here are deterministic already
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it
        torch.use_deterministic_algorithms(True)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    data = torch.frombuffer(bytearray(corpus(args.corpus_bytes)), dtype=torch.uint8).long()
    batches = Batches(data, context=args.context, batch=args.batch_size, seed=args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    model = TinyLM(
        context=args.context,
        d_model=args.d_model,
        layers=args.layers,
        heads=args.heads,
        dropout=args.dropout,
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, args.steps // 10)

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, args.steps))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    loss_value = float("nan")
    with ResumableRun(
        model,
        optimizer,
        scheduler,
        every_steps=args.every_steps,
        async_checkpoint=args.async_checkpoint,
    ) as run:
        start = run.restore()
        data_state: dict[str, Any] = run.data_state or {"epoch": 0, "position": 0}
        print(
            f"start step={start} of {args.steps} job={run.job_id} "
            f"store={run.store.root_uri} device={device}",
            flush=True,
        )
        model.train()
        paced = time.monotonic()  # when the next step is due, with --step-time-s
        for step in range(start, args.steps):
            x, y, data_state = batches.next(data_state)
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            loss_value = loss.item()
            run.step_done(step, data_state)  # first: a checkpoint it takes is reported kept
            if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                kept = run.last_checkpoint.step if run.last_checkpoint else 0
                report_progress(step + 1, args.steps, checkpoint_step=kept)
                print(
                    f"step {step + 1}/{args.steps} loss {loss_value:.4f} "
                    f"lr {scheduler.get_last_lr()[0]:.2e}",
                    flush=True,
                )
            if args.step_sleep_s > 0:
                time.sleep(args.step_sleep_s)
            if args.step_time_s > 0:  # on a schedule: a slow step is made up after it
                paced += args.step_time_s
                time.sleep(max(0.0, paced - time.monotonic()))
        run.finish()
    print(
        f"done steps={args.steps} loss={loss_value:.4f} params_sha256={state_digest(model)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
