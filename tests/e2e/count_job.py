"""A tiny resumable job for the live e2e tests: no torch, starts in a fraction of a second.

Its state is a hash chain, `digest(n + 1) = sha256(digest(n) || n)`, so the final digest
equals `expected_digest(job, steps)` only if every step ran exactly once in order from a
checkpoint that held exactly the state of the step it names (a lost or repeated step, or a
checkpoint restored from the wrong step, gives another digest).

    python count_job.py --steps N [--every K] [--sleep-s S]

Reads HELIOTROPE_JOB_ID, HELIOTROPE_CHECKPOINT_URI (the region's store: it resumes from the
newest verified checkpoint there), HELIOTROPE_PROGRESS_FILE and HELIOTROPE_PREEMPT_FILE as
the local provider sets them. Checkpoints every K steps, at once on SIGTERM or on a
preemption notice (then exits 0), and at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

STATE = "state.json"


def seed_digest(job_id: str) -> str:
    return hashlib.sha256(job_id.encode()).hexdigest()


def next_digest(digest: str, step: int) -> str:
    return hashlib.sha256(f"{digest}/{step}".encode()).hexdigest()


def expected_digest(job_id: str, steps: int) -> str:
    digest = seed_digest(job_id)
    for step in range(steps):
        digest = next_digest(digest, step)
    return digest


def main(argv: list[str]) -> int:
    from orchestrator.checkpoints import CheckpointExists, CheckpointStore
    from orchestrator.training.progress import report_progress

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--every", type=int, default=5)
    p.add_argument("--sleep-s", type=float, default=0.1)
    args = p.parse_args(argv)

    job_id = os.environ["HELIOTROPE_JOB_ID"]
    store = CheckpointStore(os.environ["HELIOTROPE_CHECKPOINT_URI"])
    notice = os.environ.get("HELIOTROPE_PREEMPT_FILE", "")
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)

    def save(step: int, digest: str) -> None:
        state = json.dumps({"step": step, "digest": digest}).encode()
        with contextlib.suppress(CheckpointExists):  # the same step: the same state, saved
            store.write(job_id, step, {STATE: state}, now_s=time.time())

    ref = store.latest(job_id)
    if ref is None:
        step, digest = 0, seed_digest(job_id)
    else:
        state = json.loads(store.read(ref)[STATE])
        step, digest = int(state["step"]), str(state["digest"])
        print(f"restored step {step} from {ref.uri}", flush=True)
    while step < args.steps:
        if stop or (notice and Path(notice).exists()):
            save(step, digest)
            print(f"stopped at step {step}", flush=True)
            return 0
        time.sleep(args.sleep_s)
        digest = next_digest(digest, step)
        step += 1
        if step % args.every == 0:
            save(step, digest)
        report_progress(step, args.steps)
    save(step, digest)
    print(f"finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
