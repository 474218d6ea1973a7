"""Crash at every phase, for real: `heliotrope controller run` is a process, SIGKILLed by a
failpoint (orchestrator/failpoints.py) right after it committed each transition of a
migration, then started again.

Per phase: a fresh home and the local provider; a small resumable job (tests/e2e/
count_job.py: a hash chain, checkpointed every few steps) starts under controller A; a
manual move (`heliotrope migrate`'s `migrate`) sends it to another region through the
migration machine; A dies by SIGKILL right after committing the transition into the phase.
For `planned`, the process that commits it is `heliotrope migrate` itself: A is SIGKILLed
just before, and the `migrate` process dies by the failpoint. The job's instance processes
outlive A (they run in their own sessions). Controller B, with no failpoint, must adopt
them and finish the move, and the job. Checked:

- the kill was the failpoint's (exit by SIGKILL, its line on stderr), after the transition
  was committed (the record or its event is in the store);
- from the kill to the end, never more than one live instance of the job, and none at the
  end: no orphan process of any instance that A started;
- when B starts only after the job finished at the destination (`+finished`), the move
  still ends DONE: a destination checkpoint newer than the moved one proves the restore;
- exactly two instances were ever launched for the job (source and destination, or source
  and the rollback's relaunch): nothing was launched twice;
- the migration ends DONE (FAILED for a rollback, with the job back at the source), the
  job finished once, where the migration left it;
- the final checkpoint there verifies, and its state is that of an uninterrupted run (no
  step lost or repeated).

`rolling_back` and `failed` are reached by occupying the destination's one slot with
another cluster's instance: the launch there is refused (CAPACITY) and the move rolls back.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from orchestrator.checkpoints import CheckpointStore
from orchestrator.jobs import parse_jobs
from orchestrator.live.commands import migrate
from orchestrator.live.world import LOCAL_REGIONS, LiveSettings, local_world
from orchestrator.model import EventKind, Phase
from orchestrator.state import open_store
from providers.base import LaunchSpec
from providers.local import LocalProvider
from tests.e2e.count_job import STATE, expected_digest

REPO = Path(__file__).resolve().parents[2]
JOB = "lm"
# The job runs for some 4 s: long enough that the move starts while it runs at the source
# (it may finish at the destination before the move is over: the machine must cope). For
# `planned`, it must outlive two process starts (`migrate`, then B) at the source.
STEPS = 80
SLEEP_S = 0.05
EVERY = 5
SPEED = 600.0
INTERVAL_S = 120.0  # scenario seconds: a tick every 0.2 s of wall time
# `planned` last of these: the first case starts cold (bytecode compiled), and it is the
# one that needs the job to run longest at the source.
MOVE = ["checkpointing", "copying", "provisioning", "restoring", "running", "done", "planned"]
BACK = ["rolling_back", "failed"]  # the destination is full: the launch there is refused
# B starts only after the job has finished at the destination, unwatched.
UNWATCHED = ["provisioning+finished"]


class Home:
    def __init__(self, root: Path, pycache: Path) -> None:
        self.root = root
        self.db_url = f"sqlite:///{root / 'heliotrope.db'}"
        self.settings = LiveSettings(
            db_url=self.db_url,
            policy="on-demand",
            speed=SPEED,
            interval_s=INTERVAL_S,
            capacity=1,
            days=1,
            signals="scenario",
        )
        root.mkdir(parents=True)
        (root / "config.yaml").write_text(
            yaml.safe_dump(self.settings.model_dump(mode="json", exclude_none=True))
        )
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HELIOTROPE_")}
        self.env["HELIOTROPE_HOME"] = str(root)
        # Some ten processes start per case: let them share compiled bytecode (outside the
        # repository) even where PYTHONDONTWRITEBYTECODE is set.
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.env["PYTHONPYCACHEPREFIX"] = str(pycache)

    def popen(
        self, *argv: str, failpoint: str | None, log: str, failpoints: str | None = None
    ) -> subprocess.Popen[bytes]:
        env = dict(self.env)
        if failpoint is not None:
            env["HELIOTROPE_FAILPOINTS"] = f"migration.after={failpoint}"
        if failpoints is not None:
            env["HELIOTROPE_FAILPOINTS"] = failpoints
        with (self.root / f"{log}.log").open("wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "orchestrator.cli", *argv],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def checkpoints(self, region: str) -> CheckpointStore:
        return CheckpointStore(f"file://{self.root / 'local' / region / 'checkpoints'}")

    def running_in(self) -> str | None:
        """The region of an instance of the job that has reported progress (it runs)."""
        for path in sorted((self.root / "local").glob("*/instances/*/progress.json")):
            return path.parts[-4]
        return None

    def launched(self) -> list[str]:
        """The regions of every instance ever launched for the job (one directory each)."""
        metas = (self.root / "local").glob("*/instances/*/meta.json")
        return sorted(m.parts[-4] for m in metas if json.loads(m.read_text())["job_id"] == JOB)

    def live_instances(self) -> dict[str, set[int]]:
        """Live (non-zombie) processes started for the job by this home's provider, by
        instance id: the wrapper shell and the job itself."""
        marker = f"HELIOTROPE_PROGRESS_FILE={self.root / 'local'}/".encode()
        found: dict[str, set[int]] = {}
        for pid in _pids():
            environ = _environ(pid)
            if environ is None or not any(e.startswith(marker) for e in environ):
                continue
            if f"HELIOTROPE_JOB_ID={JOB}".encode() not in environ or not _running(pid):
                continue
            instance = next(e for e in environ if e.startswith(b"HELIOTROPE_INSTANCE_ID="))
            found.setdefault(instance.split(b"=", 1)[1].decode(), set()).add(pid)
        return found


def _pids() -> Iterator[int]:
    return (int(name) for name in os.listdir("/proc") if name.isdigit())


def _environ(pid: int) -> list[bytes] | None:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X", "x")


def wait_for(what: str, until: object, timeout_s: float, *procs: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():  # type: ignore[operator]
        for proc in procs:
            assert proc.poll() is None, f"{what}: process {proc.pid} exited {proc.returncode}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def pycache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pycache")


@pytest.fixture
def home(tmp_path: Path, pycache: Path) -> Iterator[Home]:
    h = Home(tmp_path / "home", pycache)
    yield h
    for procs in h.live_instances().values():  # never leak a process, even on failure
        for pid in procs:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def submit(home: Home, steps: int) -> None:
    command = [
        sys.executable,
        str(REPO / "tests" / "e2e" / "count_job.py"),
        "--steps",
        str(steps),
        "--every",
        str(EVERY),
        "--sleep-s",
        str(SLEEP_S),
    ]
    doc = {
        "jobs": [
            {
                "name": JOB,
                "work_gpu_hours": 1.0,
                "gpus": 1,
                "gpu_types": ["L4"],
                "throughput": {"L4": 1.0},
                "start_offset_h": 0,
                "deadline_h": 20,
                "home_region": "us-east-1",
                "checkpoint_size_gb": 0.001,
                "cold_start_h": 0.01,
                "command": command,
            }
        ]
    }
    store = open_store(home.db_url)
    try:
        store.submit(parse_jobs(doc, trace_start=home.settings.start))
    finally:
        store.close()


def block(home: Home, region: str, monkeypatch: pytest.MonkeyPatch) -> LocalProvider:
    """Fill `region`'s one slot with an instance of another cluster."""
    monkeypatch.setenv("HELIOTROPE_HOME", str(home.root))
    world = local_world(home.settings)
    other = LocalProvider(
        home.root / "local",
        cluster="blocker",
        offers=world.grid.offers,
        capacity={r: 1 for r, _ in LOCAL_REGIONS},
        clock=world.clock,
        grace_s=1.0,
    )
    offer = next(o for o in world.grid.offers if o.region == region)
    out = other.launch(
        LaunchSpec(
            job_id="blocker",
            offer_id=offer.id,
            cluster="blocker",
            startup_s=0.0,
            count=1,
            entrypoint=(sys.executable, "-c", "import time; time.sleep(300)"),
        ),
        request_id="blocker",
    )
    assert out.instance_id is not None, out.error
    return other


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", MOVE + BACK + UNWATCHED)
def test_controller_sigkilled_after_each_transition(
    home: Home, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    phase, _, unwatched = case.partition("+")
    rolls_back = phase in BACK
    steps = STEPS * 5 // 2 if phase == "planned" else STEPS
    submit(home, steps)
    procs: list[subprocess.Popen[bytes]] = []
    a = home.popen(
        "controller",
        "run",
        "--interval",
        str(INTERVAL_S),
        failpoint=None if phase == "planned" else phase,
        log="a",
    )
    procs.append(a)
    blocker: LocalProvider | None = None
    try:
        wait_for("the job to run", lambda: home.running_in() is not None, 30, a)
        src = home.running_in()
        assert src is not None
        dst = next(r for r, _ in reversed(LOCAL_REGIONS) if r != src)
        if rolls_back:
            blocker = block(home, dst, monkeypatch)
        if phase == "planned":
            # `heliotrope migrate` commits PLANNED, so it is the process that dies; A is
            # SIGKILLed just before, so that only the record is left for B.
            a.send_signal(signal.SIGKILL)
            assert a.wait(30) == -signal.SIGKILL
            mig = home.popen("migrate", JOB, "--to", dst, "--json", failpoint=phase, log="mig")
            procs.append(mig)
            assert mig.wait(30) == -signal.SIGKILL, home.log("mig")
            said = home.log("mig")
        else:
            # The same command, in this process (one process start less, so the job can be
            # short): its tick races A's commits, and retries when A wins.
            with monkeypatch.context() as env:
                env.setenv("HELIOTROPE_HOME", str(home.root))
                plan = migrate(JOB, dst, market=None, dry_run=False, force=False)
            assert plan["started"] is True
            assert a.wait(30) == -signal.SIGKILL, home.log("a")
            said = home.log("a")
        assert f"failpoint migration.after={phase}: SIGKILL" in said, said

        # The transition was committed before the kill.
        store = open_store(home.db_url)
        moves = [e.detail for e in store.history(JOB) if e.kind is EventKind.MIGRATION]
        store.close()
        entered = "planned:" if phase == "planned" else f"-> {phase}"
        assert any(d.startswith(entered) or entered in d for d in moves), moves
        orphans = home.live_instances()
        assert len(orphans) <= 1, orphans
        if unwatched:  # the job finishes at the destination while no controller runs
            wait_for("the job to finish", lambda: not home.live_instances(), 30)

        # B adopts what A left running and finishes the move and the job.
        b = home.popen(
            "controller",
            "run",
            "--interval",
            str(INTERVAL_S),
            "--until-done",
            failpoint=None,
            log="b",
        )
        procs.append(b)
        deadline = time.monotonic() + 60
        while b.poll() is None:
            live = home.live_instances()
            assert len(live) <= 1, f"two instances of the job at once: {live}"
            if time.monotonic() > deadline:
                pytest.fail(f"B did not finish:\n{home.log('b')}")
            time.sleep(0.1)
        assert b.returncode == 0, home.log("b")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if blocker is not None:
            blocker.terminate(list(blocker.list_instances(cluster="blocker")), request_id="unblock")

    # No orphan: nothing is left of the instances A started (`orphans`), nor of any other.
    assert home.live_instances() == {}, "a process of the job outlived the run"

    store = open_store(home.db_url)
    try:
        history = store.history(JOB)
        loaded, _ = store.load()
        assert store.open_migrations() == []
    finally:
        store.close()
    moves = [e.detail for e in history if e.kind is EventKind.MIGRATION]
    end = "rolling_back -> failed" if rolls_back else "running -> done"
    assert sum(d.startswith(end) for d in moves) == 1, moves
    finished = [e for e in history if e.kind is EventKind.FINISHED]
    where = src if rolls_back else dst
    assert len(finished) == 1, history
    assert finished[0].offer_id.split(":")[1].startswith(where), finished
    assert loaded.rows[JOB].phase == Phase.DONE
    said = [f"{e.kind.value}: {e.detail}" for e in history]
    assert home.launched() == sorted([src, src if rolls_back else dst]), said

    ckpts = home.checkpoints(where)
    ref = ckpts.latest(JOB)
    assert ref is not None and ref.step == steps
    ckpts.verify(ref)
    state = json.loads(ckpts.read(ref)[STATE])
    assert state == {"step": steps, "digest": expected_digest(JOB, steps)}


@pytest.mark.timeout(120)
def test_controller_sigkilled_right_after_a_launch_never_launches_twice(home: Home) -> None:
    """A launches the job and dies before committing it; B, in a later tick, asks the
    provider with the same request id (the job's launch count, not the tick) and adopts the
    instance A made: one instance ever, recorded, and the job finishes on it."""
    submit(home, STEPS)
    a = home.popen(
        "controller",
        "run",
        "--interval",
        str(INTERVAL_S),
        failpoint=None,
        failpoints=f"launch.after={JOB}",
        log="a",
    )
    assert a.wait(30) == -signal.SIGKILL, home.log("a")
    assert f"failpoint launch.after={JOB}: SIGKILL" in home.log("a")
    store = open_store(home.db_url)
    try:
        assert not [e for e in store.history(JOB) if e.kind is EventKind.LAUNCHED]
    finally:
        store.close()
    assert len(home.launched()) == 1
    time.sleep(1.5)  # scenario time moves on: B ticks in a later tick than A
    b = home.popen(
        "controller", "run", "--interval", str(INTERVAL_S), "--until-done", failpoint=None, log="b"
    )
    try:
        deadline = time.monotonic() + 60
        while b.poll() is None:
            assert len(home.live_instances()) <= 1, "two instances of the job at once"
            if time.monotonic() > deadline:
                pytest.fail(f"B did not finish:\n{home.log('b')}")
            time.sleep(0.1)
        assert b.returncode == 0, home.log("b")
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    assert len(home.launched()) == 1, "B launched the job again"
    store = open_store(home.db_url)
    try:
        history = store.history(JOB)
    finally:
        store.close()
    launched = [e for e in history if e.kind is EventKind.LAUNCHED]
    assert len(launched) == 1 and launched[0].instance_id
    assert [e.kind for e in history].count(EventKind.FINISHED) == 1
