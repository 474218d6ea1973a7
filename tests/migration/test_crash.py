"""Crash at every phase, as a pure simulation.

A scripted world (tests/migration/world.py) applies the machine's actions; a controller
following the documented protocol is killed at each tick in turn — before saving, after
saving but before acting, after performing only the first action — and resumes from its
last saved record. Every run must end the way the uninterrupted run ends, with exactly one
live instance of the job (none only where the source cannot be relaunched, which the
record says), a verified checkpoint it restored from, and no lost work.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.migration import Limits, Migration, MigrationPhase
from providers.base import FailureKind
from tests.migration.world import (
    DST,
    SRC,
    Controller,
    Crash,
    Preempt,
    Run,
    Script,
    World,
    start,
)

P = MigrationPhase
LIMITS = Limits(
    checkpoint_timeout_s=600,
    stop_grace_s=120,
    copy_timeout_s=600,
    provision_timeout_s=600,
    restore_timeout_s=600,
    rollback_timeout_s=900,
    max_attempts=3,
)
CAP, QUOTA, TRANSIENT = FailureKind.CAPACITY, FailureKind.QUOTA, FailureKind.TRANSIENT


@dataclass(frozen=True)
class Scenario:
    name: str
    script: Script
    phase: MigrationPhase  # how it ends
    runs_on: str | None  # the offer of the job's one live instance at the end (None: none)


SCENARIOS = [
    Scenario("moves", Script(), P.DONE, DST),
    Scenario("moves a preempted job (no instance)", Script(src_alive=False), P.DONE, DST),
    Scenario("terminates a source that keeps running", Script(stops_on_request=False), P.DONE, DST),
    Scenario("copy fails once", Script(copy_failures=1), P.DONE, DST),
    Scenario("transient launch failure", Script(launch_failures={DST: [TRANSIENT]}), P.DONE, DST),
    Scenario("no capacity at the destination", Script(launch_failures={DST: [CAP]}), P.FAILED, SRC),
    Scenario(
        "no capacity, job had no instance",
        Script(src_alive=False, launch_failures={DST: [CAP]}),
        P.FAILED,
        SRC,
    ),
    Scenario("quota at the destination", Script(launch_failures={DST: [QUOTA]}), P.FAILED, SRC),
    Scenario(
        "transient failures use up the attempts",
        Script(launch_failures={DST: [TRANSIENT] * 3}),
        P.FAILED,
        SRC,
    ),
    Scenario("copy always fails", Script(copy_failures=3), P.FAILED, SRC),
    Scenario(
        "destination preempted while booting", Script(preempt_dst=Preempt.BOOTING), P.FAILED, SRC
    ),
    Scenario(
        "destination preempted while restoring",
        Script(preempt_dst=Preempt.RESTORING),
        P.FAILED,
        SRC,
    ),
    Scenario("restore hangs", Script(dst_restore_hangs=True), P.FAILED, SRC),
    Scenario("job ignores the checkpoint request", Script(answers_request=False), P.FAILED, SRC),
    Scenario(
        "rollback launch retried", Script(launch_failures={DST: [CAP], SRC: [CAP]}), P.FAILED, SRC
    ),
    Scenario(
        "source cannot be relaunched",
        Script(launch_failures={DST: [CAP], SRC: [QUOTA]}),
        P.FAILED,
        None,
    ),
]


def check_end(world: World, m0: Migration, run: Run, scenario: Scenario) -> None:
    m = run.final
    live = world.live()
    assert m.phase is scenario.phase, (m.phase, m.error)
    assert [i.offer_id for i in live] == ([scenario.runs_on] if scenario.runs_on else [])
    # no checkpoint is ever removed; the one the job had at the start is still there
    assert world.stores[SRC][0].uri == f"{SRC}/ckpt-10"
    # the source instance was only terminated after a new verified checkpoint existed
    for ck in world.terminated_src_after:
        assert ck is not None and ck.verified and ck.created_at_s >= m0.started_s
    # no duplicate purchase at the destination
    assert len([i for i in world.instances.values() if i.offer_id == DST]) <= 1
    if not live:
        assert "holds no instance" in m.error
        return
    [inst] = live
    assert inst.id == (m.dst_instance_id if m.phase is P.DONE else m.src_instance_id)
    if inst.launched_by:  # restored from the newest verified checkpoint where it runs
        newest = world.newest(inst.offer_id)
        assert newest is not None and newest.verified
        assert inst.restored_step == newest.step
        # nothing lost: the step the job was at when asked to stop (or its last checkpoint)
        asked = world.script.src_alive and world.script.answers_request
        assert inst.restored_step == (world.script.job_step if asked else 10)


def uninterrupted(scenario: Scenario) -> Run:
    world, m0 = start(scenario.script)
    run = Controller(world, m0, LIMITS).run()
    check_end(world, m0, run, scenario)
    return run


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_uninterrupted(scenario: Scenario) -> None:
    run = uninterrupted(scenario)
    assert run.phases[0] == "planned" and run.phases[-1] == scenario.phase


@pytest.mark.parametrize("crash", list(Crash))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_crash_at_every_tick(scenario: Scenario, crash: Crash) -> None:
    """Killed at tick t (for every t of the run), restarted, it ends the same way."""
    clean = uninterrupted(scenario)
    crashed_in: set[str] = set()
    for tick in range(clean.ticks + 1):
        world, m0 = start(scenario.script)
        run = Controller(world, m0, LIMITS).run(crash_at=frozenset({tick}), crash=crash)
        check_end(world, m0, run, scenario)  # the path may differ (a restart acts sooner)
        for lost, again in run.reissued:
            # a restarted controller asks for exactly what was lost, under the same ids
            assert again[1] == lost[1]
            if crash is Crash.BEFORE_SAVE:
                assert again == lost
        crashed_in.update(phase for pair in run.crashed_in for phase in pair)
    assert set(clean.phases) <= crashed_in  # it was killed in every phase it went through


@pytest.mark.parametrize("crash", list(Crash))
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_crash_at_every_tick_of_one_run(scenario: Scenario, crash: Crash) -> None:
    """Killed once at every single tick of the same run, it still ends the same way."""
    world, m0 = start(scenario.script)
    run = Controller(world, m0, LIMITS).run(crash_at=frozenset(range(200)), crash=crash)
    check_end(world, m0, run, scenario)


scripts = st.builds(
    Script,
    src_alive=st.booleans(),
    stops_on_request=st.booleans(),
    answers_request=st.booleans(),
    launch_failures=st.fixed_dictionaries(
        {
            DST: st.lists(st.sampled_from(list(FailureKind)), max_size=3),
            SRC: st.lists(st.sampled_from(list(FailureKind)), max_size=3),
        }
    ),
    copy_failures=st.integers(0, 3),
    preempt_dst=st.sampled_from(list(Preempt)),
    dst_restore_hangs=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(
    script=scripts,
    crash_at=st.frozensets(st.integers(0, 60), max_size=8),
    crash=st.sampled_from(list(Crash)),
)
def test_any_world_any_crashes(script: Script, crash_at: frozenset[int], crash: Crash) -> None:
    """Whatever fails and wherever the controller dies, the end is the uninterrupted end."""
    world, m0 = start(script)
    clean = Controller(world, m0, LIMITS).run()
    expected = Scenario(
        "random", script, clean.final.phase, world.live()[0].offer_id if world.live() else None
    )
    check_end(world, m0, clean, expected)
    world, m0 = start(script)
    run = Controller(world, m0, LIMITS).run(crash_at=crash_at, crash=crash)
    check_end(world, m0, run, expected)
    assert run.final.phase is clean.final.phase
