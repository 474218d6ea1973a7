"""Async sharded checkpoints in real processes (2 gloo ranks, DDP): every rank's save of
one step hangs half way through a file while training goes on, then every rank is killed
(SIGKILL: nothing cleans up). The previous checkpoint stays the latest and verifies, the
half-written step is invisible, and the job resumed from it ends bit-identical to a run
that never stopped."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from orchestrator.checkpoints import CheckpointStore
from orchestrator.training.sharded import SHARDED_FORMAT
from tests.training.gang_jobs import STEP_LINE, bare_gang, base_env

JOB = "async-crash"
JOB_MODULE = [sys.executable, "-m", "tests.training.async_crash_job"]


def test_a_crash_mid_async_save_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    steps = 16
    reference = bare_gang(
        tmp_path,
        "reference",
        world=2,
        args=["--steps", str(steps)],
        env=base_env(JOB, f"file://{tmp_path}/reference"),
        program=JOB_MODULE,
    )
    store = CheckpointStore(f"file://{tmp_path}/ckpt")
    crash = bare_gang(
        tmp_path,
        "crash",
        world=2,
        args=["--steps", "1000", "--stall-step", "8", "--step-sleep-s", "0.02"],
        env=base_env(JOB, store.root_uri, STALL_MARKERS=str(tmp_path)),
        program=JOB_MODULE,
    )
    markers = [tmp_path / f"stalled-{rank}" for rank in range(2)]
    try:
        deadline = time.monotonic() + 90
        while not all(m.exists() for m in markers):  # both ranks' saves of step 8 hang
            assert time.monotonic() < deadline, crash.output()
            assert all(p.proc.poll() is None for p in crash.procs), crash.output()
            time.sleep(0.05)
        # ... and the loop trains on while they do (step 12's checkpoint waits for them)
        crash.wait_for_step(11, timeout_s=90)
    finally:
        for p in crash.procs:
            p.proc.kill()
        codes = crash.finish()
    assert codes == [-9, -9]
    printed = [int(m.group(1)) for line in crash.leader_lines() if (m := STEP_LINE.match(line))]
    assert max(printed) == 11, printed  # never past the checkpoint that waits for step 8's

    (ref,) = store.list(JOB)
    assert ref.step == 4 and store.metadata(ref)["format"] == SHARDED_FORMAT
    latest = store.latest(JOB)
    assert latest is not None and latest.step == 4
    store.verify(latest)
    half = tmp_path / "ckpt" / JOB / "step-000000000008"
    assert half.is_dir() and any(half.iterdir())  # written in part ...
    assert not (half / "manifest.json").exists()  # ... and never published

    resumed = bare_gang(
        tmp_path,
        "resumed",
        world=2,
        args=["--steps", str(steps)],
        env=base_env(JOB, store.root_uri),
        program=JOB_MODULE,
    )
    assert resumed.finish() == [0, 0], resumed.output()
    assert reference.finish() == [0, 0], reference.output()
    assert resumed.start().group(1) == "4"
    assert [r.step for r in store.list(JOB)] == [4, 8, 12, 16]  # step 8 written afresh
    for r in store.list(JOB):
        store.verify(r)
    assert re.fullmatch(r"[0-9a-f]{64}", resumed.done().group(3))
    assert resumed.done().group(3) == reference.done().group(3)
