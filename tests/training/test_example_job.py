"""The example job, as real subprocesses: interrupted, moved between stores and resumed, it
ends bit-identical to a run that never stopped; SIGTERM means checkpoint, then exit 0.

The test plays the orchestrator: it launches `examples/train_lm.py` with HELIOTROPE_*
environment in "region" A or B (each with its own store root), interrupts it, copies the
newest verified checkpoint to the other region with `CheckpointStore.copy` and launches it
there again.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from orchestrator.checkpoints import CheckpointRef, CheckpointStore
from orchestrator.training import STATE_FILE, state_digest
from orchestrator.training.state_io import load_state_files
from tests.training.metadata_server import metadata_server

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_lm.py"
JOB = "lm-test"
STEPS = 40
TINY = [
    "--steps",
    str(STEPS),
    "--seed",
    "7",
    "--batch-size",
    "8",
    "--context",
    "32",
    "--d-model",
    "32",
    "--layers",
    "2",
    "--heads",
    "2",
    "--corpus-bytes",
    "60000",
    "--log-every",
    "1",
    "--every-steps",
    "5",
]
STEP_LINE = re.compile(r"^step (\d+)/")
DONE_LINE = re.compile(r"^done steps=(\d+) loss=\S+ params_sha256=([0-9a-f]{64})$")


@dataclass
class Leg:
    proc: subprocess.Popen[str]
    stderr_path: Path
    lines: list[str]

    def wait_for_step(self, at_least: int, timeout_s: float = 30.0) -> int:
        """Read progress lines until step >= at_least; returns the step seen."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                pytest.fail(f"the job ended before step {at_least}:\n{self.output()}")
            self.lines.append(line.rstrip("\n"))
            match = STEP_LINE.match(line)
            if match and int(match.group(1)) >= at_least:
                return int(match.group(1))
        pytest.fail(f"no step {at_least} within {timeout_s}s:\n{self.output()}")

    def finish(self, timeout_s: float = 60.0) -> int:
        out, _ = self.proc.communicate(timeout=timeout_s)
        self.lines.extend(out.splitlines())
        return self.proc.returncode

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def output(self) -> str:
        return "\n".join(self.lines) + "\n--- stderr ---\n" + self.stderr()


def launch(tmp: Path, name: str, store_root: str, *extra: str, **env: str) -> Leg:
    stderr_path = tmp / f"{name}.stderr"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HELIOTROPE_")}
    full_env.update(
        {
            "HELIOTROPE_JOB_ID": JOB,
            "HELIOTROPE_CHECKPOINT_URI": store_root,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            **env,
        }
    )
    err: IO[str] = stderr_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), *TINY, *extra],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    err.close()
    return Leg(proc, stderr_path, [])


def final_digest(leg: Leg) -> str:
    for line in leg.lines:
        if match := DONE_LINE.match(line):
            assert int(match.group(1)) == STEPS
            return match.group(2)
    pytest.fail(f"no done line:\n{leg.output()}")


def load(store: CheckpointStore, ref: CheckpointRef) -> Any:
    return load_state_files(lambda name: store.open_file(ref, name), name=STATE_FILE)


def move(src: CheckpointStore, dest: CheckpointStore, request_id: str) -> CheckpointRef:
    ref = src.latest(JOB)
    assert ref is not None
    copy = src.copy(ref, dest, request_id=request_id)
    assert dest.latest(JOB) == copy
    return copy


def test_moved_and_interrupted_three_times_ends_bit_identical(tmp_path: Path) -> None:
    region_a = CheckpointStore(f"file://{tmp_path}/region-a")
    region_b = CheckpointStore(f"file://{tmp_path}/region-b")
    reference_store = f"file://{tmp_path}/reference"
    # the uninterrupted run goes on alongside (each job uses one thread)
    reference = launch(tmp_path, "reference", reference_store)
    pace = ["--step-sleep-s", "0.03"]
    resumed_at: list[int] = []

    # 1. region A, SIGTERM: checkpoint at once, exit 0
    leg = launch(tmp_path, "leg1", region_a.root_uri, *pace)
    seen = leg.wait_for_step(6)
    leg.proc.send_signal(signal.SIGTERM)
    assert leg.finish() == 0, leg.output()
    assert "preempted (SIGTERM" in leg.stderr()
    ref = region_a.latest(JOB)
    assert ref is not None and seen <= ref.step < STEPS
    assert region_a.metadata(ref)["reason"] == "preemption"
    resumed_at.append(move(region_a, region_b, "move-1").step)

    # 2. region B, async checkpoints, a local notice file
    flag = tmp_path / "preempt-now"
    leg = launch(
        tmp_path,
        "leg2",
        region_b.root_uri,
        *pace,
        "--async-checkpoint",
        HELIOTROPE_NOTICE_SOURCE="local",
        HELIOTROPE_PREEMPT_FILE=str(flag),
    )
    seen = leg.wait_for_step(resumed_at[-1] + 7)
    flag.write_text("spot capacity reclaimed\n")
    assert leg.finish() == 0, leg.output()
    assert "preempted (file: spot capacity reclaimed)" in leg.stderr()
    assert f"start step={resumed_at[-1]} of {STEPS}" in leg.lines[0]
    flag.unlink()
    resumed_at.append(move(region_b, region_a, "move-2").step)

    # 3. region A, an AWS spot interruption notice from the (fake) instance metadata service
    with metadata_server() as (url, imds):
        leg = launch(
            tmp_path,
            "leg3",
            region_a.root_uri,
            *pace,
            HELIOTROPE_NOTICE_SOURCE="aws",
            HELIOTROPE_METADATA_URL=url,
            HELIOTROPE_NOTICE_POLL_S="0.05",
        )
        leg.wait_for_step(resumed_at[-1] + 4)
        imds.preempted = True
        assert leg.finish() == 0, leg.output()
    assert "preempted (aws: terminate at 2024-05-01T12:00:00Z)" in leg.stderr()
    resumed_at.append(move(region_a, region_b, "move-3").step)

    # 4. region B, killed without notice (SIGKILL): the last periodic checkpoint is all there is
    leg = launch(tmp_path, "leg4", region_b.root_uri, *pace)
    seen = leg.wait_for_step(resumed_at[-1] + 7)
    leg.proc.send_signal(signal.SIGKILL)
    assert leg.finish() == -signal.SIGKILL
    ref = region_b.latest(JOB)
    assert ref is not None and resumed_at[-1] < ref.step < seen  # some steps are redone
    resumed_at.append(move(region_b, region_a, "move-4").step)

    # 5. region A, to the end
    leg = launch(tmp_path, "leg5", region_a.root_uri)
    assert leg.finish() == 0, leg.output()
    assert reference.finish() == 0, reference.output()

    assert resumed_at == sorted(set(resumed_at)) and resumed_at[-1] < STEPS, resumed_at
    assert final_digest(leg) == final_digest(reference)
    # the whole final state, optimizer and scheduler included, is bit-identical too
    ref_store = CheckpointStore(reference_store)
    want = load(ref_store, ref_store.latest(JOB))  # type: ignore[arg-type]
    got = load(region_a, region_a.latest(JOB))  # type: ignore[arg-type]
    for part in ("model", "optimizer", "scheduler", "data_state"):
        assert state_digest({"x": got[part]}) == state_digest({"x": want[part]}), part
    assert got["data_state"] == want["data_state"] and got["step"] == STEPS


def test_sigterm_before_any_periodic_checkpoint_saves_and_exits_zero(tmp_path: Path) -> None:
    store = CheckpointStore(f"file://{tmp_path}/ckpt")
    leg = launch(tmp_path, "leg", store.root_uri, "--step-sleep-s", "0.03", "--every-steps", "1000")
    seen = leg.wait_for_step(3)
    leg.proc.send_signal(signal.SIGTERM)
    assert leg.finish() == 0, leg.output()
    (ref,) = store.list(JOB)
    store.verify(ref)
    assert seen <= ref.step < STEPS
    assert store.metadata(ref)["reason"] == "preemption"
    assert not any(DONE_LINE.match(line) for line in leg.lines)
    tree = load(store, ref)
    assert tree["step"] == ref.step and tree["data_state"]["position"] == ref.step * 8
