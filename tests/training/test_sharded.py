"""Sharded checkpoints in one process: the store's multi-writer publishing, DCP through the
store (round trip, corruption, what the metadata unpickler refuses) and ResumableRun's
distributed path in a one-rank gloo world (notice agreement, periodic checkpoints)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from orchestrator.checkpoints import CheckpointExists, CheckpointStore, CorruptCheckpoint
from orchestrator.errors import InputError, PermanentError
from orchestrator.training import PreemptionNotice, ResumableRun, state_digest
from orchestrator.training.sharded import (
    METADATA_FILE,
    SHARDED_FORMAT,
    SafeLoadPlanner,
    StoreReader,
    StoreWriter,
    portable,
    read_metadata,
    shard_file,
)

JOB = "shard-job"
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def store_at(tmp_path: Path, name: str = "ckpt") -> CheckpointStore:
    return CheckpointStore(f"file://{tmp_path}/{name}", durable=False)


# -- the store: parts written by several writers, published by one --------------------------


def test_parts_are_invisible_until_published_with_every_entry(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    a = store.write_part(JOB, 7, lambda open_file: _put(open_file, "part-a", b"a" * 100))
    b = store.write_part(JOB, 7, lambda open_file: _put(open_file, "part-b", b"b" * 50))
    assert store.list(JOB) == []
    ref = store.publish(JOB, 7, {**a, **b}, now_s=1.0, metadata={"world_size": "2"})
    assert store.list(JOB) == [ref] and ref.size_bytes == 150
    store.verify(ref)
    assert store.read(ref) == {"part-a": b"a" * 100, "part-b": b"b" * 50}
    with pytest.raises(CheckpointExists):
        store.write_part(JOB, 7, lambda open_file: _put(open_file, "late", b"x"))
    with pytest.raises(CheckpointExists):
        store.publish(JOB, 7, a, now_s=2.0)


def test_publish_refuses_a_part_that_is_missing_or_of_another_size(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    a = store.write_part(JOB, 3, lambda open_file: _put(open_file, "part-a", b"a" * 10))
    b = store.write_part(JOB, 3, lambda open_file: _put(open_file, "part-b", b"b" * 10))
    (tmp_path / "ckpt" / JOB / "step-000000000003" / "part-b").write_bytes(b"short")
    with pytest.raises(CorruptCheckpoint, match="part-b: size differs"):
        store.publish(JOB, 3, {**a, **b}, now_s=1.0)
    (tmp_path / "ckpt" / JOB / "step-000000000003" / "part-b").unlink()
    with pytest.raises(CorruptCheckpoint, match="part-b: missing"):
        store.publish(JOB, 3, {**a, **b}, now_s=1.0)
    assert store.list(JOB) == []
    store.discard_unpublished(JOB, 3)
    assert not (tmp_path / "ckpt" / JOB / "step-000000000003").exists()
    with pytest.raises(InputError, match="now_s"):
        store.publish(JOB, 3, a, now_s=float("nan"))


def test_corrupt_checkpoint_errors_cross_process_boundaries() -> None:
    exc = CorruptCheckpoint("file:///x/step-1", "shard-r00001", "sha256 differs")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.uri, back.file, back.reason, str(back)) == (
        exc.uri,
        exc.file,
        exc.reason,
        str(exc),
    )
    wrapped = portable(InputError("ResumableRun", "x", "y", got=1))  # not picklable itself
    assert isinstance(wrapped, PermanentError) and "ResumableRun" in str(wrapped)
    assert pickle.loads(pickle.dumps(wrapped)).args == wrapped.args


def _put(open_file: object, name: str, data: bytes) -> None:
    with open_file(name) as out:  # type: ignore[operator]
        out.write(data)


# -- DCP through the store, in one process -------------------------------------------------


def _state() -> dict[str, object]:
    g = torch.Generator().manual_seed(1)
    return {
        "w": torch.randn(33, 7, generator=g),
        "b": torch.arange(5, dtype=torch.int64),
        "h": torch.randn(4, generator=g).half(),
        "lr": 0.25,
        "names": ["a", "b"],
    }


def _save(store: CheckpointStore, step: int, state: dict[str, object]) -> None:
    writer = StoreWriter(store, JOB, step)
    dcp_save(state, storage_writer=writer, no_dist=True)
    store.publish(
        JOB,
        step,
        writer.entries,
        now_s=float(step),
        metadata={"format": SHARDED_FORMAT, "world_size": "1"},
    )


def test_dcp_round_trip_through_the_store(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    state = _state()
    _save(store, 5, state)
    (ref,) = store.list(JOB)
    assert set(store.manifest(ref).files) == {METADATA_FILE, shard_file(0)}
    target = {
        "w": torch.zeros(33, 7),
        "b": torch.zeros(5, dtype=torch.int64),
        "h": torch.zeros(4).half(),
        "lr": 0.0,
        "names": [],
    }
    dcp_load(
        target, storage_reader=StoreReader(store, ref), planner=SafeLoadPlanner(), no_dist=True
    )
    assert state_digest(target) == state_digest(state)
    assert (target["lr"], target["names"]) == (0.25, ["a", "b"])


def test_a_flipped_byte_in_a_shard_fails_the_load(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    _save(store, 5, _state())
    (ref,) = store.list(JOB)
    path = tmp_path / "ckpt" / JOB / "step-000000000005" / shard_file(0)
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF
    path.write_bytes(bytes(data))
    target = {
        "w": torch.zeros(33, 7),
        "b": torch.zeros(5, dtype=torch.int64),
        "h": torch.zeros(4).half(),
        "lr": 0.0,
        "names": [],
    }
    with pytest.raises(BaseException) as info:  # DCP's CheckpointException wraps it
        dcp_load(
            target, storage_reader=StoreReader(store, ref), planner=SafeLoadPlanner(), no_dist=True
        )
    assert "CorruptCheckpoint" in str(info.value) and shard_file(0) in str(info.value)


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned",))


def test_the_metadata_unpickler_refuses_anything_but_dcp_metadata(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    ref = store.write(JOB, 1, {METADATA_FILE: pickle.dumps(_Evil())}, now_s=1.0)
    with pytest.raises(PermanentError, match=r"posix\.system is not DCP metadata"):
        read_metadata(store, ref)


# -- ResumableRun in a one-rank gloo world ------------------------------------------------


@pytest.fixture
def one_rank_world(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return net, torch.optim.AdamW(net.parameters(), lr=1e-2)


def _train(net: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 6, generator=g)
    loss = net(x).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


@pytest.mark.parametrize("every", [1, 4])
def test_a_notice_is_acted_on_when_the_ranks_have_agreed(
    tmp_path: Path, one_rank_world: None, every: int
) -> None:
    store = store_at(tmp_path)
    net, optimizer = _model()
    run = ResumableRun(
        net,
        optimizer,
        job_id=JOB,
        store=store,
        every_steps=1000,
        agree_every_steps=every,
        handle_signals=False,
        exit_on_preemption=False,
    )
    with run:
        assert run.restore() == 0
        stopped = None
        for step in range(20):
            _train(net, optimizer, step)
            if step == 5:
                run.notify_preemption(PreemptionNotice("test"))
            run.step_done(step, {"step": step + 1})
            if run.preempted is not None:
                stopped = step + 1
                break
    # issued after steps 1, 1 + every, ...: the first from step 6 on, collected one step later
    want = 1 + -(-5 // every) * every + 1
    assert stopped == want
    (ref,) = store.list(JOB)
    assert ref.step == want and store.metadata(ref)["format"] == SHARDED_FORMAT


def test_by_default_the_ranks_agree_about_once_a_second(
    tmp_path: Path, one_rank_world: None
) -> None:
    clock = [0.0]
    store = store_at(tmp_path)
    net, optimizer = _model()
    run = ResumableRun(
        net,
        optimizer,
        job_id=JOB,
        store=store,
        every_steps=1000,
        handle_signals=False,
        exit_on_preemption=False,
        monotonic=lambda: clock[0],
    )
    with run:
        run.restore()
        for step in range(200):
            clock[0] += 0.1  # steps of 0.1 s: an agreement every 10 steps
            _train(net, optimizer, step)
            if step == 50:
                run.notify_preemption(PreemptionNotice("test"))
            run.step_done(step)
            if run.preempted is not None:
                break
    (ref,) = store.list(JOB)
    assert 51 < ref.step <= 51 + 10 + 1, ref.step


def test_a_due_checkpoint_agrees_at_once_and_restores_in_a_gang(
    tmp_path: Path, one_rank_world: None
) -> None:
    store = store_at(tmp_path)
    net, optimizer = _model()
    with ResumableRun(
        net,
        optimizer,
        job_id=JOB,
        store=store,
        every_steps=3,
        agree_every_steps=100,
        handle_signals=False,
        exit_on_preemption=False,
    ) as run:
        run.restore()
        for step in range(5):
            _train(net, optimizer, step)
            if step == 4:
                run.notify_preemption(PreemptionNotice("test"))
            run.step_done(step, {"step": step + 1})
        # step 3 was due; step 5 was not, and agreement is only every 100 steps
        assert [r.step for r in store.list(JOB)] == [3] and run.preempted is None
        run.finish()
    assert [r.step for r in store.list(JOB)] == [3, 5]
    want = state_digest(net)

    other, other_opt = _model()
    with ResumableRun(other, other_opt, job_id=JOB, store=store, handle_signals=False) as again:
        assert again.restore() == 5
        assert again.data_state == {"step": 5} and again.restored_world_size == 1
    assert state_digest(other) == want
    assert state_digest(other_opt.state_dict()["state"]) == state_digest(
        optimizer.state_dict()["state"]
    )


def test_agreement_cadence_must_be_positive(tmp_path: Path) -> None:
    net, optimizer = _model()
    with pytest.raises(InputError, match="agree_every_steps"):
        ResumableRun(
            net,
            optimizer,
            job_id=JOB,
            store=store_at(tmp_path),
            agree_every_steps=0,
            handle_signals=False,
        )
    with pytest.raises(InputError, match="HELIOTROPE_NOTICE_AGREE_EVERY_STEPS"):
        ResumableRun(
            net,
            optimizer,
            job_id=JOB,
            store=store_at(tmp_path),
            handle_signals=False,
            environ={"HELIOTROPE_NOTICE_AGREE_EVERY_STEPS": "often"},
        )


def test_a_single_process_checkpoint_is_not_restored_into_a_gang(
    tmp_path: Path, one_rank_world: None
) -> None:
    store = store_at(tmp_path)
    net, optimizer = _model()
    dist.destroy_process_group()  # write it as a plain single-process run
    try:
        with ResumableRun(
            net, optimizer, job_id=JOB, store=store, every_steps=1, handle_signals=False
        ) as run:
            run.restore()
            _train(net, optimizer, 0)
            run.step_done(0)
    finally:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path}/rendezvous2", rank=0, world_size=1
        )
    with (
        ResumableRun(net, optimizer, job_id=JOB, store=store, handle_signals=False) as run,
        pytest.raises(PermanentError, match="written by a single-process run"),
    ):
        run.restore()


def test_io_of_a_bytes_value_stays_weights_only(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    _save(store, 2, {"x": torch.ones(2), "opaque": _Box(3)})
    (ref,) = store.list(JOB)
    target: dict[str, object] = {"x": torch.zeros(2), "opaque": None}
    with pytest.raises(BaseException, match=r"Weights only load failed"):
        dcp_load(
            target, storage_reader=StoreReader(store, ref), planner=SafeLoadPlanner(), no_dist=True
        )


class _Box:
    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Box) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def test_distributed_false_keeps_to_this_process_and_true_needs_a_process_group(
    tmp_path: Path, one_rank_world: None
) -> None:
    store = store_at(tmp_path)
    net, optimizer = _model()
    with ResumableRun(
        net,
        optimizer,
        job_id=JOB,
        store=store,
        every_steps=1,
        distributed=False,
        handle_signals=False,
    ) as run:
        run.restore()
        _train(net, optimizer, 0)
        run.step_done(0)
    (ref,) = store.list(JOB)
    assert store.metadata(ref)["format"] != SHARDED_FORMAT  # the single-process format
    dist.destroy_process_group()
    try:
        with pytest.raises(InputError, match="init_process_group"):
            ResumableRun(
                net, optimizer, job_id=JOB, store=store, distributed=True, handle_signals=False
            )
    finally:
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path}/rendezvous3", rank=0, world_size=1
        )


def test_a_corrupt_sharded_checkpoint_is_skipped_and_its_step_written_again(
    tmp_path: Path, one_rank_world: None
) -> None:
    store = store_at(tmp_path)
    net, optimizer = _model()
    with ResumableRun(
        net, optimizer, job_id=JOB, store=store, every_steps=3, handle_signals=False
    ) as run:
        run.restore()
        for step in range(6):
            _train(net, optimizer, step)
            run.step_done(step, {"step": step + 1})
    assert [r.step for r in store.list(JOB)] == [3, 6]
    shard = tmp_path / "ckpt" / JOB / "step-000000000006" / shard_file(0)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    other, other_opt = _model()
    with ResumableRun(
        other, other_opt, job_id=JOB, store=store, every_steps=3, handle_signals=False
    ) as again:
        assert again.restore() == 3  # all ranks fell back past step 6
        for step in range(3, 6):
            _train(other, other_opt, step)
            again.step_done(step, {"step": step + 1})
    (ref,) = [r for r in store.list(JOB) if r.step == 6]
    store.verify(ref)  # the corrupt one was quarantined and step 6 written afresh
    assert state_digest(other) == state_digest(net)
