"""A random SIGKILL soak (`make e2e`): `heliotrope controller run` is killed at random
moments, again and again, while a resumable job runs, is moved by hand now and then, and
finishes. After every kill and at the end the invariants hold:

- never two live instances of the job at once (checked every 50 ms);
- every instance ever launched is recorded (a LAUNCHED event per instance directory): no
  duplicate launched under a new request id, none running unseen;
- the job finishes exactly once (one FINISHED event, phase DONE): no completion lost;
- its final checkpoint verifies and holds the state of an uninterrupted run.

HELIOTROPE_SOAK_KILLS (default 30) and HELIOTROPE_SOAK_SEED (default 0) size and seed it;
the test prints kills survived, duplicates and lost completions.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time

import pytest

from orchestrator.errors import HeliotropeError
from orchestrator.live.commands import migrate
from orchestrator.live.world import LOCAL_REGIONS
from orchestrator.model import EventKind, Phase
from orchestrator.state import open_store
from tests.e2e.count_job import STATE, expected_digest
from tests.e2e.test_controller_sigkill import INTERVAL_S, JOB, Home, home, pycache, submit

__all__ = ["home", "pycache"]  # the fixtures, used by name

KILLS = int(os.environ.get("HELIOTROPE_SOAK_KILLS", "30"))
SEED = int(os.environ.get("HELIOTROPE_SOAK_SEED", "0"))
STEPS = 40 * KILLS  # some 2 s of work per kill: the job outlives the soak


def recorded(home: Home) -> tuple[int, int, Phase]:
    store = open_store(home.db_url)
    try:
        history = store.history(JOB)
        phase = store.load()[0].rows[JOB].phase
    finally:
        store.close()
    launched = sum(e.kind is EventKind.LAUNCHED for e in history)
    finished = sum(e.kind is EventKind.FINISHED for e in history)
    return launched, finished, phase


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_random_sigkills_lose_nothing_and_launch_nothing_twice(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(SEED)
    submit(home, STEPS)
    most_live = kills = moves = 0
    for i in range(KILLS):
        proc = home.popen(
            "controller", "run", "--interval", str(INTERVAL_S), failpoint=None, log=f"run-{i}"
        )
        until = time.monotonic() + rng.uniform(1.5, 4.5)  # a start takes some 1.5 s
        while time.monotonic() < until and proc.poll() is None:
            most_live = max(most_live, len(home.live_instances()))
            assert most_live <= 1, f"two instances of the job at once after {kills} kills"
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            kills += 1
        if rng.random() < 0.3:  # a person moves it by hand, between two controllers
            region = rng.choice([r for r, _ in LOCAL_REGIONS])
            with monkeypatch.context() as env:
                env.setenv("HELIOTROPE_HOME", str(home.root))
                # refused with a reason when moving, done or already there
                with contextlib.suppress(HeliotropeError):
                    moves += bool(
                        migrate(JOB, region, market=None, dry_run=False, force=True)["started"]
                    )
        launched, finished, _ = recorded(home)
        assert len(home.launched()) == launched, "an instance was launched but not recorded"
        assert finished <= 1

    last = home.popen(
        "controller",
        "run",
        "--interval",
        str(INTERVAL_S),
        "--until-done",
        failpoint=None,
        log="last",
    )
    deadline = time.monotonic() + 600
    while last.poll() is None:
        assert len(home.live_instances()) <= 1
        assert time.monotonic() < deadline, home.log("last")
        time.sleep(0.1)
    assert last.returncode == 0, home.log("last")
    launched, finished, phase = recorded(home)
    duplicates = len(home.launched()) - launched
    print(
        f"\nsoak: {kills} SIGKILLs survived, {moves} manual moves, {launched} launches, "
        f"{duplicates} duplicates, {1 - finished} lost completions, at most {most_live} "
        "live instance(s)"
    )
    assert duplicates == 0 and finished == 1 and phase == Phase.DONE
    assert home.live_instances() == {}
    where = None
    for region, _ in LOCAL_REGIONS:
        ref = home.checkpoints(region).latest(JOB)
        if ref is not None and ref.step == STEPS:
            where = home.checkpoints(region)
            break
    assert where is not None, "no final checkpoint"
    ref = where.latest(JOB)
    assert ref is not None
    where.verify(ref)
    assert json.loads(where.read(ref)[STATE]) == {
        "step": STEPS,
        "digest": expected_digest(JOB, STEPS),
    }
