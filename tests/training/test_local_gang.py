"""The local provider's launch contract for distributed jobs: the gang environment, GPUs
handed out by CUDA_VISIBLE_DEVICES, and a DDP job under a bare `torchrun` (its shape from
the environment) preempted, moved to another local region and resumed bit-identical."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.checkpoints import CheckpointStore
from orchestrator.clock import FakeClock
from providers.base import EventType, FailureKind, Launcher, LaunchSpec
from providers.local import LocalProvider, local_offers
from tests.training.gang_jobs import DONE_LINE, EXAMPLE, REPO, bare_gang, base_env, free_port

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

T0 = datetime(2024, 1, 1, tzinfo=UTC)
OFFERS = local_offers(["west", "north"], gpu_count=2)
WEST, NORTH = "local:west:local-cpu:on_demand", "local:north:local-cpu:on_demand"
WRITE_ENV = "import json, os, time\njson.dump(dict(os.environ), open('env.json', 'w'))\n"
JOB = "gang-job"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., LocalProvider]]:
    def factory(gpus: list[str] | None) -> LocalProvider:
        return LocalProvider(
            tmp_path / "local",
            cluster="c",
            offers=OFFERS,
            capacity={"west": 4, "north": 4},
            clock=FakeClock(T0),
            grace_s=5.0,
            gpus=gpus,
        )

    yield factory
    for meta_file in tmp_path.glob("local/*/instances/*/meta.json"):  # leave nothing running
        pid = json.loads(meta_file.read_text()).get("pid")
        if isinstance(pid, int) and pid > 1:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def launch_env(
    provider: LocalProvider, request_id: str, code: str = WRITE_ENV, count: int = 1
) -> tuple[str | None, dict[str, str] | None, str]:
    outcome = provider.launch(
        LaunchSpec(
            job_id="j",
            offer_id=WEST,
            cluster="c",
            count=count,
            entrypoint=[sys.executable, "-c", code],
            launcher=Launcher.NONE,  # the node's own environment, not torchrun's workers'
        ),
        request_id=request_id,
    )
    if outcome.instance_id is None:
        assert outcome.error is not None and outcome.error.kind is FailureKind.CAPACITY
        return None, None, outcome.error.message
    inst_dir = provider.instance_dir(outcome.instance_id)
    assert inst_dir is not None
    deadline = time.monotonic() + 10
    while not (inst_dir / "env.json").exists():
        assert time.monotonic() < deadline, "the job did not write its environment"
        time.sleep(0.02)
    time.sleep(0.05)
    return outcome.instance_id, json.loads((inst_dir / "env.json").read_text()), ""


def test_each_instance_gets_its_own_gpus_and_the_gang_environment(
    make: Callable[..., LocalProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_PORT", "1")  # the controller's own values never leak through
    provider = make(["0", "1", "2", "3", "4", "5"])
    hold = WRITE_ENV + "time.sleep(60)\n"
    first, env, _ = launch_env(provider, "r1", hold)
    assert env is not None and first is not None
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert (env["MASTER_ADDR"], env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == (
        "127.0.0.1",
        "1",
        "0",
        "2",
    )
    assert 1024 <= int(env["MASTER_PORT"]) < 65536
    for name in ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "NPROC_PER_NODE"):
        assert env[f"PET_{name}"] == env[name]  # torchrun's defaults: no arguments needed
    assert env["HELIOTROPE_JOB_ID"] == "j" and env["HELIOTROPE_NOTICE_SOURCE"] == "local"

    # a gang of 2 instances of 2 GPUs runs as one local node of 4 processes
    second, env2, _ = launch_env(provider, "r2", hold, count=2)
    assert env2 is not None and second is not None
    assert env2["CUDA_VISIBLE_DEVICES"] == "2,3,4,5" and env2["NPROC_PER_NODE"] == "4"
    assert env2["MASTER_PORT"] != env["MASTER_PORT"]
    third, _, refusal = launch_env(provider, "r3", hold)
    assert third is None and "local GPUs: fewer than 2 of 6 free" in refusal

    provider.terminate([first], request_id="stop-1")  # its GPUs are free again
    fourth, env4, _ = launch_env(provider, "r4", hold)
    assert env4 is not None and env4["CUDA_VISIBLE_DEVICES"] == "0,1"
    # a repeated request is the same instance: nothing new is handed out
    again = provider.launch(
        LaunchSpec(job_id="j", offer_id=WEST, cluster="c", entrypoint=[sys.executable, "-c", hold]),
        request_id="r4",
    )
    assert again.instance_id == fourth
    provider.terminate([i for i in (second, fourth) if i], request_id="stop-all")


def test_a_machine_without_gpus_sets_no_cuda_visible_devices(
    make: Callable[..., LocalProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _, env, _ = launch_env(make([]), "r1")
    assert env is not None
    assert "CUDA_VISIBLE_DEVICES" not in env and env["NPROC_PER_NODE"] == "2"


def test_a_ddp_job_under_bare_torchrun_is_preempted_moved_and_resumed(
    make: Callable[..., LocalProvider], tmp_path: Path
) -> None:
    provider = make([])
    steps = 16
    args = [
        "--hidden",
        "32",
        "--batch-size",
        "16",
        "--steps",
        str(steps),
        "--seed",
        "9",
        "--log-every",
        "1",
        "--every-steps",
        "1000",
    ]
    reference = bare_gang(
        tmp_path, "reference", world=2, args=args, env=base_env(JOB, f"file://{tmp_path}/reference")
    )
    entry = [sys.executable, "-m", "torch.distributed.run", str(EXAMPLE), *args]
    env = {
        "HELIOTROPE_CHECKPOINT_URI": provider.checkpoint_uri("west"),
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
    }
    paced = LaunchSpec(
        job_id=JOB,
        offer_id=WEST,
        cluster="c",
        entrypoint=[*entry, "--step-sleep-s", "0.1"],
        env=env,
    )
    west = provider.launch(paced, request_id="west-1").instance_id
    assert west is not None
    log = provider.instance_dir(west) / "stdout.log"  # type: ignore[operator]
    deadline = time.monotonic() + 60
    while "step 4/" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.05)
    assert provider.preempt(west, notice_s=30.0)
    events = provider.poll_events()
    assert EventType.PREEMPTED in {e.type for e in events}
    text = log.read_text(errors="replace")
    assert text.count("preempted (file") == 2, text[-3000:]  # both ranks saw the node's notice

    src = CheckpointStore(provider.checkpoint_uri("west"))
    ref = src.latest(JOB)
    assert ref is not None and 4 <= ref.step < steps
    src.copy(ref, CheckpointStore(provider.checkpoint_uri("north")), request_id="move")
    north = provider.launch(
        LaunchSpec(
            job_id=JOB,
            offer_id=NORTH,
            cluster="c",
            entrypoint=entry,
            env={**env, "HELIOTROPE_CHECKPOINT_URI": provider.checkpoint_uri("north")},
        ),
        request_id="north-1",
    ).instance_id
    assert north is not None
    deadline = time.monotonic() + 90
    final: list[EventType] = []
    while not final:
        assert time.monotonic() < deadline, "the resumed job did not finish"
        final = [
            e.type
            for e in provider.poll_events()
            if e.type in (EventType.COMPLETED, EventType.FAILED)
        ]
        time.sleep(0.1)
    north_log = (provider.instance_dir(north) / "stdout.log").read_text(  # type: ignore[operator]
        errors="replace"
    )
    assert final == [EventType.COMPLETED], north_log[-3000:]
    assert f"start step={ref.step} of {steps} world=2" in north_log
    assert reference.finish() == [0, 0], reference.output()
    done = [m for line in north_log.splitlines() if (m := DONE_LINE.match(line))]
    assert len(done) == 1 and done[0].group(3) == reference.done().group(3)


def _node_spec(offer_id: str, store_uri: str, node: int, port: int, args: list[str]) -> LaunchSpec:
    """Node `node` of a 2-node gang of 2 processes each: one local instance running
    torchrun with the gang's shape given explicitly (the job "says otherwise" than the
    instance's one-node defaults), the static rendezvous on node 0's port."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    shape = ["--node-rank", str(node), "--nproc-per-node", "2"]
    master = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return LaunchSpec(
        job_id=JOB,
        offer_id=offer_id,
        cluster="c",
        entrypoint=[*torchrun, *shape, *master, str(EXAMPLE), *args],
        env={
            "HELIOTROPE_NOTICE_AGREE_EVERY_STEPS": "1",  # a notice acted on within 2 steps
            "HELIOTROPE_CHECKPOINT_URI": store_uri,
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
        },
    )


def _wait_until_ended(
    provider: LocalProvider, ids: list[str], seen: dict[str, EventType], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    final = (EventType.COMPLETED, EventType.FAILED, EventType.PREEMPTED)
    while not all(i in seen for i in ids):
        assert time.monotonic() < deadline, f"not ended in {timeout_s}s: {ids}, {seen}"
        for event in provider.poll_events():
            if event.type in final:
                seen[event.instance_id] = event.type
        time.sleep(0.1)


def test_two_nodes_of_two_preempted_twice_and_moved_across_regions_end_bit_identical(
    make: Callable[..., LocalProvider], tmp_path: Path
) -> None:
    """2 local instances x 2 processes (gloo), one torchrun gang: a notice to node 1 only,
    the checkpoint copied to the other region, the gang launched there; twice; then run to
    the end and compared with 4 ranks that never stopped."""
    provider = make([])
    steps = 32
    args = [*GANG_MODEL, "--steps", str(steps), "--seed", "3", "--every-steps", "1000"]
    reference = bare_gang(
        tmp_path, "reference", world=4, args=args, env=base_env(JOB, f"file://{tmp_path}/ref")
    )
    offers = {"west": WEST, "north": NORTH}
    seen: dict[str, EventType] = {}
    resumed = 0
    for leg, (here, there) in enumerate([("west", "north"), ("north", "west"), ("west", None)]):
        port = free_port()
        uri = provider.checkpoint_uri(here)
        paced = [*args, "--step-sleep-s", "0.05"] if there else args
        nodes = []
        for node in range(2):
            outcome = provider.launch(
                _node_spec(offers[here], uri, node, port, paced), request_id=f"leg{leg}-node{node}"
            )
            assert outcome.instance_id is not None, outcome.error
            nodes.append(outcome.instance_id)
        logs = [provider.instance_dir(i) / "stdout.log" for i in nodes]  # type: ignore[operator]
        if there is None:  # the last leg runs to the end
            _wait_until_ended(provider, nodes, seen, timeout_s=180)
            assert [seen[i] for i in nodes] == [EventType.COMPLETED] * 2, _tail(logs)
            break
        _wait_for_line(logs[0], f"step {resumed + 5}/", timeout_s=120)
        assert provider.preempt(nodes[1], notice_s=60.0)  # node 1's notice file only
        _wait_until_ended(provider, nodes, seen, timeout_s=90)
        # node 1 preempted; node 0 agreed, checkpointed the same step and exited 0
        assert [seen[i] for i in nodes] == [EventType.COMPLETED, EventType.PREEMPTED], _tail(logs)
        text = [log.read_text(errors="replace") for log in logs]
        assert text[0].count("preempted (gang") == 2 and text[1].count("preempted (file") == 2
        src = CheckpointStore(uri)
        ref = src.latest(JOB)
        assert ref is not None and resumed + 5 <= ref.step < steps, ref
        meta = src.metadata(ref)
        assert (meta["reason"], meta["world_size"]) == ("preemption", "4")
        assert f"start step={resumed} of {steps} world=4" in text[0]
        resumed = src.copy(
            ref, CheckpointStore(provider.checkpoint_uri(there)), request_id=f"move-{leg}"
        ).step
    last = logs[0].read_text(errors="replace")
    assert f"start step={resumed} of {steps} world=4" in last
    assert reference.finish() == [0, 0, 0, 0], reference.output()
    done = [m for line in last.splitlines() if (m := DONE_LINE.match(line))]
    assert len(done) == 1, last[-3000:]
    assert done[0].group(3) == reference.done().group(3)  # the gathered model, bit for bit
    assert done[0].group(2) == reference.done().group(2)


GANG_MODEL = ["--hidden", "32", "--log-every", "1", "--batch-size", "16"]


def _wait_for_line(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)


def _tail(logs: list[Path]) -> str:
    return "\n".join(f"=== {log}\n{log.read_text(errors='replace')[-2500:]}" for log in logs)
