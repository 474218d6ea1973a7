"""ResumableRun in-process: restore is exact, notices checkpoint at once, async writes in
the background, corrupt checkpoints are skipped, configuration comes from the environment."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from orchestrator.checkpoints import CheckpointRef, CheckpointStore
from orchestrator.errors import InputError, PermanentError
from orchestrator.training import PreemptionNotice, ResumableRun, state_digest
from orchestrator.training.state_io import load_state_files

JOB = "job-1"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)  # buffers that change in forward
        self.drop = torch.nn.Dropout(0.2)
        self.b = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(self.drop(torch.relu(self.bn(self.a(x)))))
        return out


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make(
    store: CheckpointStore, **kwargs: Any
) -> tuple[Net, torch.optim.Optimizer, Any, ResumableRun]:
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    kwargs.setdefault("every_steps", 3)
    run = ResumableRun(model, opt, sched, job_id=JOB, store=store, notice_sources=[], **kwargs)
    return model, opt, sched, run


def train(
    run: ResumableRun,
    model: Net,
    opt: torch.optim.Optimizer,
    sched: Any,
    start: int,
    stop: int,
    data_state: dict[str, Any],
) -> dict[str, Any]:
    for step in range(start, stop):
        n = 4 + random.randrange(4)  # python RNG
        x = torch.from_numpy(np.random.standard_normal((n, 8)).astype(np.float32))  # numpy
        x = x + 0.1 * torch.randn(n, 8)  # torch RNG (and dropout)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        data_state = {"position": data_state["position"] + n, "seen": [*data_state["seen"], n]}
        run.step_done(step, data_state)
    return data_state


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(f"file://{tmp_path}/ckpt")


@pytest.fixture
def mem_store() -> Iterator[CheckpointStore]:
    import fsspec

    root = f"memory://run-{uuid.uuid4().hex[:8]}"
    yield CheckpointStore(root)
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


def reference(store: CheckpointStore, steps: int) -> tuple[str, dict[str, Any]]:
    seed_all(0)
    model, opt, sched, run = make(store, every_steps=1000, handle_signals=False)
    with run:
        assert run.restore() == 0
        data = train(run, model, opt, sched, 0, steps, {"position": 0, "seen": []})
    return state_digest(model), data


@pytest.mark.parametrize("async_checkpoint", [False, True])
def test_resume_is_bit_exact(
    store: CheckpointStore, mem_store: CheckpointStore, async_checkpoint: bool
) -> None:
    want_digest, want_data = reference(mem_store, 12)

    seed_all(0)
    model, opt, sched, run = make(store, async_checkpoint=async_checkpoint)
    assert run.restore() == 0
    train(run, model, opt, sched, 0, 8, {"position": 0, "seen": []})  # checkpoints at 3, 6
    run.close()  # then the process "dies" at step 8: steps 7 and 8 are lost
    assert [r.step for r in store.list(JOB)] == [3, 6]

    seed_all(1234)  # a fresh process: other seeds, other initial weights
    model, opt, sched, run = make(store, async_checkpoint=async_checkpoint)
    with run:
        start = run.restore()
        assert start == 6 and run.restored_from == store.list(JOB)[-1]
        assert sched.last_epoch == 6 and run.data_state["position"] > 0
        data = train(run, model, opt, sched, start, 12, run.data_state)
        run.finish()
    assert state_digest(model) == want_digest
    assert data == want_data
    assert [r.step for r in store.list(JOB)] == [3, 6, 9, 12]
    assert len(run.stall_s) == 2


@pytest.mark.parametrize("exit_on_preemption", [True, False])
def test_a_notice_checkpoints_at_once(store: CheckpointStore, exit_on_preemption: bool) -> None:
    seed_all(0)
    model, opt, sched, run = make(store, every_steps=100, exit_on_preemption=exit_on_preemption)
    run.restore()
    data = train(run, model, opt, sched, 0, 4, {"position": 0, "seen": []})
    assert store.list(JOB) == []
    run.notify_preemption(PreemptionNotice("aws", "terminate at 2024-01-01T00:00:00Z"))
    if exit_on_preemption:
        with pytest.raises(SystemExit) as info:
            train(run, model, opt, sched, 4, 10, data)
        assert info.value.code == 0
    else:
        train(run, model, opt, sched, 4, 5, data)
    assert run.preempted is not None and run.preempted.source == "aws"
    (ref,) = store.list(JOB)
    assert ref.step == 5 and store.metadata(ref)["reason"] == "preemption"


@pytest.mark.parametrize("reported_first", [True, False])
def test_the_checkpoint_a_notice_takes_is_reported_kept(
    store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reported_first: bool
) -> None:
    """The controller counts kept what the progress file says: the checkpoint taken on a
    notice is in it, not only the last one the job reported (the live run then keeps what
    the preemption really kept). With no report before, no total is known: nothing."""
    from orchestrator.training.progress import report_progress

    progress = tmp_path / "progress.json"
    monkeypatch.setenv("HELIOTROPE_PROGRESS_FILE", str(progress))
    seed_all(0)
    model, opt, sched, run = make(store, every_steps=2, exit_on_preemption=False)
    run.restore()
    data = train(run, model, opt, sched, 0, 4, {"position": 0, "seen": []})
    if reported_first:
        kept = run.last_checkpoint.step if run.last_checkpoint else 0
        report_progress(4, 20, checkpoint_step=kept)
        assert json.loads(progress.read_text())["checkpoint_fraction"] == pytest.approx(4 / 20)
    run.notify_preemption(PreemptionNotice("local"))
    train(run, model, opt, sched, 4, 5, data)
    assert run.preempted is not None and run.last_checkpoint is not None
    assert run.last_checkpoint.step == 5
    if not reported_first:
        assert not progress.exists()
        return
    report = json.loads(progress.read_text())
    assert report["checkpoint_fraction"] == pytest.approx(5 / 20)
    assert report["step"] == 5 and report["fraction"] == pytest.approx(5 / 20)


def test_sigterm_and_sigusr1_are_notices_while_the_run_lives(store: CheckpointStore) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    seed_all(0)
    model, opt, sched, run = make(store, every_steps=100, exit_on_preemption=False)
    run.restore()
    os.kill(os.getpid(), signal.SIGUSR1)
    train(run, model, opt, sched, 0, 1, {"position": 0, "seen": []})
    assert run.preempted == PreemptionNotice("SIGUSR1", "signal")
    assert [r.step for r in store.list(JOB)] == [1]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before


def test_the_preempt_file_is_a_notice(store: CheckpointStore, tmp_path: Path) -> None:
    flag = tmp_path / "preempt"
    seed_all(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    env = {
        "HELIOTROPE_JOB_ID": JOB,
        "HELIOTROPE_CHECKPOINT_URI": store.root_uri,
        "HELIOTROPE_NOTICE_SOURCE": "local",
        "HELIOTROPE_PREEMPT_FILE": str(flag),
    }
    run = ResumableRun(model, opt, environ=env, exit_on_preemption=False)
    run.restore()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4)
    data = train(run, model, opt, sched, 0, 2, {"position": 0, "seen": []})
    flag.write_text("local provider: region draining\n")
    train(run, model, opt, sched, 2, 3, data)
    assert run.preempted == PreemptionNotice("file", "local provider: region draining")
    assert [r.step for r in store.list(JOB)] == [3]


def test_restore_skips_a_corrupt_checkpoint_and_training_rewrites_it(
    store: CheckpointStore, mem_store: CheckpointStore, caplog: pytest.LogCaptureFixture
) -> None:
    want_digest, _ = reference(mem_store, 9)
    seed_all(0)
    model, opt, sched, run = make(store)
    run.restore()
    train(run, model, opt, sched, 0, 6, {"position": 0, "seen": []})
    run.close()
    newest = store.list(JOB)[-1]
    path = f"{store._ref_dir(newest)}/state.0000"
    data = bytearray(store._fs.cat_file(path))
    data[-100] ^= 0x10  # one flipped bit in the tensor bytes
    store._fs.pipe_file(path, bytes(data))

    seed_all(99)
    model, opt, sched, run = make(store)
    with caplog.at_level(logging.WARNING), run:
        start = run.restore()
        assert start == 3  # step 6 is corrupt
        train(run, model, opt, sched, start, 9, run.data_state)
    assert "corrupt" in caplog.text and "step-000000000006" in caplog.text
    assert state_digest(model) == want_digest
    assert [r.step for r in store.list(JOB)] == [3, 6, 9]
    store.verify(store.list(JOB)[1])  # step 6 written again, whole


def test_a_damaged_header_is_detected_too(store: CheckpointStore) -> None:
    seed_all(0)
    model, opt, sched, run = make(store)
    run.restore()
    train(run, model, opt, sched, 0, 3, {"position": 0, "seen": []})
    run.close()
    (ref,) = store.list(JOB)
    path = f"{store._ref_dir(ref)}/state"
    data = bytearray(store._fs.cat_file(path))
    data[40] ^= 0xFF  # inside the pickled header
    store._fs.pipe_file(path, bytes(data))
    model, opt, sched, run = make(store)
    assert run.restore() == 0
    run.close()


def test_async_writes_in_the_background(
    store: CheckpointStore, mem_store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    writing = threading.Event()
    real_write = store.write

    def slow_write(*args: Any, **kwargs: Any) -> CheckpointRef:
        writing.set()
        assert release.wait(10)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store, "write", slow_write)
    seed_all(0)
    model, opt, sched, run = make(store, async_checkpoint=True)
    run.restore()
    data = train(run, model, opt, sched, 0, 3, {"position": 0, "seen": []})
    assert writing.wait(10)  # the write started, and step_done has already returned
    before = state_digest(model)
    data = train(run, model, opt, sched, 3, 5, data)  # the loop goes on meanwhile
    assert state_digest(model) != before and store.list(JOB) == []
    release.set()
    run.finish()
    assert [r.step for r in store.list(JOB)] == [3, 5]
    # what was written is the state at step 3, not what the loop did after
    seed_all(0)
    m2, o2, s2, r2 = make(mem_store, every_steps=1000)
    r2.restore()
    train(r2, m2, o2, s2, 0, 3, {"position": 0, "seen": []})
    r2.close()
    tree = _load(store, store.list(JOB)[0])
    assert state_digest(tree["model"]) == state_digest(m2)


def _load(store: CheckpointStore, ref: CheckpointRef) -> Any:
    return load_state_files(lambda name: store.open_file(ref, name))


def test_periodic_write_failures_are_logged_and_retried(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_write = store.write
    failures = iter([True, False, False, False, True, True, True])

    def flaky(*args: Any, **kwargs: Any) -> CheckpointRef:
        if next(failures):
            raise OSError("connection reset")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store, "write", flaky)
    seed_all(0)
    model, opt, sched, run = make(store)
    run.restore()
    with caplog.at_level(logging.ERROR):
        data = train(run, model, opt, sched, 0, 4, {"position": 0, "seen": []})
    assert "checkpoint write failed" in caplog.text
    assert [r.step for r in store.list(JOB)] == [4]  # retried at the next step
    data = train(run, model, opt, sched, 4, 10, data)
    with pytest.raises(OSError, match="connection reset"):  # a third failure in a row
        train(run, model, opt, sched, 10, 16, data)  # due at 13, retried at 14 and 15
    run.close()


def test_every_minutes_uses_the_clock(store: CheckpointStore) -> None:
    now = [0.0]
    seed_all(0)
    model, opt, sched, run = make(
        store, every_steps=None, every_minutes=1.0, monotonic=lambda: now[0]
    )
    run.restore()
    data = train(run, model, opt, sched, 0, 3, {"position": 0, "seen": []})
    now[0] = 61.0
    data = train(run, model, opt, sched, 3, 5, data)
    now[0] = 100.0
    train(run, model, opt, sched, 5, 7, data)
    run.close()
    assert [r.step for r in store.list(JOB)] == [4]


def test_step_done_needs_restore_first(store: CheckpointStore) -> None:
    _, _, _, run = make(store)
    with pytest.raises(PermanentError, match="restore"):
        run.step_done(0, {})
    run.close()


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"HELIOTROPE_CHECKPOINT_URI": "memory://x"}, "HELIOTROPE_JOB_ID"),
        ({"HELIOTROPE_JOB_ID": JOB}, "HELIOTROPE_CHECKPOINT_URI"),
        ({"HELIOTROPE_JOB_ID": "bad id", "HELIOTROPE_CHECKPOINT_URI": "memory://x"}, "job_id"),
        ({"HELIOTROPE_CHECKPOINT_EVERY_STEPS": "ten"}, "HELIOTROPE_CHECKPOINT_EVERY_STEPS"),
        ({"HELIOTROPE_CHECKPOINT_EVERY_MINUTES": "-1"}, "HELIOTROPE_CHECKPOINT_EVERY_MINUTES"),
        ({"HELIOTROPE_CHECKPOINT_ASYNC": "maybe"}, "HELIOTROPE_CHECKPOINT_ASYNC"),
        ({"HELIOTROPE_NOTICE_SOURCE": "ibm"}, "HELIOTROPE_NOTICE_SOURCE"),
        ({"HELIOTROPE_NOTICE_POLL_S": "0"}, "HELIOTROPE_NOTICE_POLL_S"),
        ({"HELIOTROPE_CHECKPOINT_STORAGE_OPTIONS": "[1]"}, "HELIOTROPE_CHECKPOINT_STORAGE_OPTIONS"),
    ],
)
def test_bad_environment_is_an_input_error(env: dict[str, str], field: str) -> None:
    full = {"HELIOTROPE_JOB_ID": JOB, "HELIOTROPE_CHECKPOINT_URI": "memory://env-test", **env}
    for key in ("HELIOTROPE_JOB_ID", "HELIOTROPE_CHECKPOINT_URI"):
        if key not in env and field == key:
            del full[key]
    model = Net()
    with pytest.raises(InputError, match=field):
        ResumableRun(model, torch.optim.SGD(model.parameters(), lr=0.1), environ=full)


def test_configuration_from_the_environment() -> None:
    model = Net()
    env = {
        "HELIOTROPE_JOB_ID": "lm-7",
        "HELIOTROPE_CHECKPOINT_URI": "memory://env-ok",
        "HELIOTROPE_CHECKPOINT_EVERY_STEPS": "50",
        "HELIOTROPE_CHECKPOINT_ASYNC": "1",
    }
    run = ResumableRun(model, torch.optim.SGD(model.parameters(), lr=0.1), environ=env)
    assert (
        run.job_id,
        run.store.root_uri,
        run.every_steps,
        run.every_minutes,
        run.async_checkpoint,
    ) == ("lm-7", "memory://env-ok", 50, None, True)
    run.close()
    run = ResumableRun(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        environ={**env, "HELIOTROPE_CHECKPOINT_EVERY_STEPS": ""},
        every_steps=None,
    )
    assert (run.every_steps, run.every_minutes) == (None, 30.0)  # the default cadence
    run.close()


def test_a_failed_background_write_is_redone_by_finish(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_write = store.write
    calls: list[int] = []

    def fail_first(*args: Any, **kwargs: Any) -> CheckpointRef:
        calls.append(args[1])
        if len(calls) == 1:
            raise OSError("bucket throttled")
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store, "write", fail_first)
    seed_all(0)
    model, opt, sched, run = make(store, async_checkpoint=True)
    run.restore()
    train(run, model, opt, sched, 0, 3, {"position": 0, "seen": []})  # async write of step 3
    with caplog.at_level(logging.ERROR):
        assert run.finish() == store.list(JOB)[-1]
    assert calls == [3, 3] and [r.step for r in store.list(JOB)] == [3]
    assert "bucket throttled" in caplog.text
