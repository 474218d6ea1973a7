"""Distributed jobs as real processes (gloo, CPU): examples/train_ddp.py under torchrun and
as bare ranks. A checkpoint written by 4 ranks resumes on 2 (and in one process) with the
same model state and a later loss equal to a run resumed on 4; a notice to one rank stops
all at one step. (A 2 x 2 gang preempted twice and moved between local regions, ending
bit-identical: test_local_gang.py.)"""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path
from typing import Any

import torch

from orchestrator.checkpoints import CheckpointRef, CheckpointStore
from orchestrator.training import ResumableRun, state_digest
from orchestrator.training.sharded import rank_file, shard_file
from orchestrator.training.state_io import load_state_files
from tests.training.gang_jobs import (
    EXAMPLE,
    PREEMPTED_LINE,
    bare_gang,
    base_env,
    torchrun_gang,
)

JOB = "ddp-test"
MODEL = ["--hidden", "32", "--log-every", "1", "--batch-size", "16"]


def example_module() -> Any:
    spec = importlib.util.spec_from_file_location("train_ddp_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def move(src: CheckpointStore, dest: CheckpointStore, request_id: str) -> CheckpointRef:
    ref = src.latest(JOB)
    assert ref is not None
    return src.copy(ref, dest, request_id=request_id)


def test_saved_by_four_ranks_resumes_on_two_and_in_one_process(tmp_path: Path) -> None:
    # FSDP2: each rank holds a quarter of every parameter and of the optimizer state
    args = [*MODEL, "--seed", "5", "--dropout", "0", "--fsdp", "--every-steps", "10"]
    four = CheckpointStore(f"file://{tmp_path}/four")
    two = CheckpointStore(f"file://{tmp_path}/two")
    first = torchrun_gang(
        tmp_path,
        "four",
        nodes=1,
        nproc=4,
        args=[*args, "--steps", "10"],
        env=base_env(JOB, four.root_uri),
    )
    assert first.finish() == [0], first.output()
    at_ten = first.done().group(3)
    ref = four.latest(JOB)
    assert ref is not None and ref.step == 10
    names = set(four.manifest(ref).files)
    assert {shard_file(r) for r in range(4)} | {rank_file(r) for r in range(4)} <= names
    move(four, two, "to-two")

    # a smaller machine: 2 ranks continue from step 10 with the same (gathered) model
    smaller = torchrun_gang(
        tmp_path,
        "two",
        nodes=1,
        nproc=2,
        args=[*args, "--steps", "20"],
        env=base_env(JOB, two.root_uri),
    )
    same = torchrun_gang(
        tmp_path,
        "four-again",
        nodes=1,
        nproc=4,
        args=[*args, "--steps", "20"],
        env=base_env(JOB, four.root_uri),
    )
    assert smaller.finish() == [0], smaller.output()
    assert same.finish() == [0], same.output()
    start = smaller.start()
    assert (start.group(1), start.group(3), start.group(4)) == ("10", "2", "4")
    assert start.group(5) == at_ten
    assert same.start().group(5) == at_ten
    # the same optimization goes on: equal losses up to float rounding
    loss_two, loss_four = float(smaller.done().group(2)), float(same.done().group(2))
    assert abs(loss_two - loss_four) <= 1e-5 * max(1.0, abs(loss_four)), (loss_two, loss_four)

    # and one plain process (no torch.distributed) restores the same state
    torch.manual_seed(0)
    net = example_module().Net(32, 0.0)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
    single = CheckpointStore(f"file://{tmp_path}/single")
    four_ref = four.list(JOB)[0]
    four.copy(four_ref, single, request_id="to-one")
    with ResumableRun(net, optimizer, job_id=JOB, store=single, handle_signals=False) as run:
        assert run.restore() == 10
        assert run.restored_world_size == 4
        assert run.data_state == {"step": 10}
    assert state_digest(net.state_dict()) == at_ten
    assert optimizer.state_dict()["state"][0]["step"].item() == 10


def test_a_notice_to_rank_three_only_stops_every_rank_at_one_step(tmp_path: Path) -> None:
    store = CheckpointStore(f"file://{tmp_path}/ckpt")
    gang = bare_gang(
        tmp_path,
        "gang",
        world=4,
        args=[*MODEL, "--steps", "500", "--step-sleep-s", "0.05", "--every-steps", "1000"],
        env=base_env(JOB, store.root_uri),
    )
    gang.wait_for_step(4)
    gang.procs[3].proc.send_signal(signal.SIGUSR1)
    assert gang.finish() == [0, 0, 0, 0], gang.output()
    stopped = []
    for rank, proc in enumerate(gang.procs):
        match = PREEMPTED_LINE.search(proc.stderr())
        assert match is not None, proc.stderr()
        assert match.group(1) == ("SIGUSR1" if rank == 3 else "gang"), match.group(0)
        stopped.append(int(match.group(2)))
    assert len(set(stopped)) == 1, stopped
    (ref,) = store.list(JOB)
    store.verify(ref)
    assert ref.step == stopped[0] and store.metadata(ref)["reason"] == "preemption"
    for rank in range(4):
        extras = load_state_files(lambda name: store.open_file(ref, name), name=rank_file(rank))
        assert (extras["rank"], extras["step"], extras["data_state"]) == (
            rank,
            ref.step,
            {"step": ref.step},
        )
