"""Launching examples/train_ddp.py as a gang of real processes for the distributed tests:
under torchrun (one torchrun per node, static rendezvous on 127.0.0.1, gloo), or as bare
rank processes with the environment torchrun would give them (so a test can signal one
rank)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
STEP_LINE = re.compile(r"^step (\d+)/")
START_LINE = re.compile(
    r"^start step=(\d+) of (\d+) world=(\d+) job=\S+"
    r"(?: restored_world=(\d+) params_sha256=([0-9a-f]{64}))?$"
)
DONE_LINE = re.compile(r"^done steps=(\d+) loss=(\S+) params_sha256=([0-9a-f]{64})$")
PREEMPTED_LINE = re.compile(r"preempted \((\w+)[^)]*\): checkpoint \S+ holds step (\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(job_id: str, store_uri: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HELIOTROPE_", "MASTER_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    env.update(
        {
            "HELIOTROPE_JOB_ID": job_id,
            "HELIOTROPE_CHECKPOINT_URI": store_uri,
            "PYTHONPATH": str(REPO),
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            **extra,
        }
    )
    return env


@dataclass
class Proc:
    """One process of a gang (a torchrun agent or a bare rank), its output in files."""

    name: str
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def stdout(self) -> list[str]:
        return self.out.read_text(errors="replace").splitlines()

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


@dataclass
class Gang:
    procs: list[Proc] = field(default_factory=list)

    def wait_for_step(self, at_least: int, timeout_s: float = 60.0) -> int:
        """Wait until the leader (rank 0) printed step >= at_least; the step seen."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.procs[0].stdout():
                match = STEP_LINE.match(line)
                if match and int(match.group(1)) >= at_least:
                    return int(match.group(1))
            if any(p.proc.poll() is not None for p in self.procs):
                pytest.fail(f"the gang ended before step {at_least}:\n{self.output()}")
            time.sleep(0.05)
        pytest.fail(f"no step {at_least} within {timeout_s}s:\n{self.output()}")

    def finish(self, timeout_s: float = 120.0) -> list[int]:
        codes = []
        try:
            for p in self.procs:
                codes.append(p.proc.wait(timeout=timeout_s))
        finally:
            for p in self.procs:
                if p.proc.poll() is None:
                    p.proc.kill()
                    p.proc.wait()
        return codes

    def leader_lines(self) -> list[str]:
        return self.procs[0].stdout()

    def start(self) -> re.Match[str]:
        for line in self.leader_lines():
            if match := START_LINE.match(line):
                return match
        pytest.fail(f"no start line:\n{self.output()}")

    def done(self) -> re.Match[str]:
        for line in self.leader_lines():
            if match := DONE_LINE.match(line):
                return match
        pytest.fail(f"no done line:\n{self.output()}")

    def output(self) -> str:
        return "\n".join(
            f"=== {p.name} stdout\n"
            + "\n".join(p.stdout()[-30:])
            + f"\n=== {p.name} stderr\n"
            + p.stderr()[-4000:]
            for p in self.procs
        )


def _spawn(tmp: Path, name: str, argv: list[str], env: dict[str, str]) -> Proc:
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=e
        )
    return Proc(name, proc, out, err)


def torchrun_gang(
    tmp: Path,
    name: str,
    *,
    nodes: int,
    nproc: int,
    args: list[str],
    env: dict[str, str],
    node_env: list[dict[str, str]] | None = None,
) -> Gang:
    """`nodes` torchrun agents on this machine, each with `nproc` workers: the launch
    contract's variables (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, NPROC_PER_NODE)
    turned into torchrun's arguments, as a node's launcher does."""
    port = free_port()
    gang = Gang()
    for node in range(nodes):
        node_vars = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "NNODES": str(nodes),
            "NODE_RANK": str(node),
            "NPROC_PER_NODE": str(nproc),
        }
        full = {**env, **node_vars, **(node_env[node] if node_env else {})}
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            full["NNODES"],
            "--node-rank",
            full["NODE_RANK"],
            "--nproc-per-node",
            full["NPROC_PER_NODE"],
            "--master-addr",
            full["MASTER_ADDR"],
            "--master-port",
            full["MASTER_PORT"],
            str(EXAMPLE),
            *args,
        ]
        gang.procs.append(_spawn(tmp, f"{name}-node{node}", argv, full))
    return gang


def bare_gang(
    tmp: Path,
    name: str,
    *,
    world: int,
    args: list[str],
    env: dict[str, str],
    program: list[str] | None = None,
) -> Gang:
    """`world` rank processes with the environment torchrun gives its workers, each running
    `program` (default: the example) with `args`."""
    port = free_port()
    gang = Gang()
    for rank in range(world):
        full = {
            **env,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
        }
        gang.procs.append(
            _spawn(
                tmp,
                f"{name}-rank{rank}",
                [*(program or [sys.executable, str(EXAMPLE)]), *args],
                full,
            )
        )
    return gang


def write_notice(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
