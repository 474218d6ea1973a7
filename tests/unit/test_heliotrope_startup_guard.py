"""heliotrope's start-up guard: no launch or move whose cold start would leave the safety
net's margin, so the net does not fire right after it (the cold start wasted, then
on-demand anyway: the pattern of the demo's lm-eu at 13:30)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from orchestrator.model import Phase
from policies.heliotrope import Heliotrope
from tests.unit.test_baselines import KEEP, World, decide

# The default job: 64 GPU-h on 8 A100s (8 h), deadline at 32 h, cold start 0.5 h; 0.25 h
# ticks, so the net's margin is 0.5 h. Running on spot offer 1, offer 3 is far cheaper.
MARGIN_H = 0.5


def running_on_spot(slack_h: float) -> World:
    # the net's slack: time left - its fresh start-up (0.5 h) - 8 h of work
    return World(phase=Phase.RUNNING, offer=1, usd_per_hour={3: 2.0}, now_h=32 - 0.5 - 8 - slack_h)


@pytest.mark.parametrize("slack_h", [0.6, 0.9])
def test_a_move_whose_cold_start_would_spend_the_margin_is_not_made(slack_h: float) -> None:
    world = running_on_spot(slack_h)
    assert decide(Heliotrope(startup_guard=False), world)[0] == 3  # the rule alone moves
    assert decide(Heliotrope(), world) == (KEEP, "")


def test_with_slack_for_the_cold_start_the_move_is_made() -> None:
    world = running_on_spot(MARGIN_H + 0.5 + 0.3)
    assert decide(Heliotrope(), world)[0] == 3


def test_an_idle_job_with_too_little_slack_for_a_spot_start_waits_for_the_net() -> None:
    world = dataclasses.replace(running_on_spot(0.8), phase=Phase.WAITING, offer=-1)
    assert decide(Heliotrope(startup_guard=False), world)[0] == 3
    assert decide(Heliotrope(), world) == (KEEP, "")
    later = dataclasses.replace(world, now_h=world.now_h + 0.3)  # slack 0.5: the net fires
    target, reason = decide(Heliotrope(), later)
    assert reason.startswith("safety net") and target in (0, 2, 4)


def test_staying_is_never_dropped_even_while_the_instance_still_starts() -> None:
    world = running_on_spot(0.6)
    snap = world.snapshot()
    booting = dataclasses.replace(
        snap.fleet, ready_at_s=np.array([snap.now_s + 0.2 * 3600.0])
    )  # 0.2 h of its own cold start left: staying has that start-up, and is kept
    decision = Heliotrope()(dataclasses.replace(snap, fleet=booting))
    assert 0 not in decision.intents
