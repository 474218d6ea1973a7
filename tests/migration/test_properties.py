"""Properties of `advance` over arbitrary observation sequences.

The observations here need not be consistent with any world (instances appear and vanish,
errors arrive unasked, checkpoints come and go): whatever the controller reports, the
machine must keep its promises.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.migration import (
    TRANSITIONS,
    CheckpointSeen,
    CopyCheckpoint,
    Launch,
    Limits,
    Migration,
    MigrationAction,
    MigrationPhase,
    Observation,
    RequestCheckpoint,
    Terminate,
    advance,
)
from providers.base import FailureKind, InstanceState

SRC, DST = "aws:us-east-1a:p3.2xlarge:spot", "gcp:europe-west4-a:a2-ultragpu-1g:spot"
T = 1_700_000_000.0
STEPS = (10, 15)


def checkpoints(side: str) -> st.SearchStrategy[CheckpointSeen | None]:
    return st.none() | st.builds(
        lambda step, created, verified: CheckpointSeen(
            f"{side}/ckpt-{step}", step, created, verified
        ),
        st.sampled_from(STEPS),
        st.sampled_from([T - 600.0, T, T + 100.0, T + 5000.0]),
        st.booleans(),
    )


states = st.none() | st.sampled_from(list(InstanceState))
observations = st.builds(
    Observation,
    src_instance_alive=st.booleans(),
    src_checkpoint=checkpoints("src"),
    dst_checkpoint=checkpoints("dst"),
    dst_instance_id=st.sampled_from(["", "dst-1", "dst-2"]),
    dst_state=states,
    dst_progress_after_restore=st.booleans(),
    launch_error=st.none() | st.none() | st.sampled_from(list(FailureKind)),
    copy_error=st.none() | st.none() | st.just("connection reset"),
    rollback_instance_id=st.sampled_from(["", "back-1"]),
    rollback_state=states,
)
ticks = st.lists(
    st.tuples(observations, st.sampled_from([0.0, 30.0, 200.0, 700.0, 4000.0])), max_size=40
)
limits = st.builds(
    Limits,
    checkpoint_timeout_s=st.sampled_from([300.0, 900.0]),
    stop_grace_s=st.sampled_from([0.0, 120.0]),
    copy_timeout_s=st.sampled_from([600.0, 3600.0]),
    provision_timeout_s=st.just(600.0),
    restore_timeout_s=st.just(600.0),
    rollback_timeout_s=st.sampled_from([600.0, 1800.0]),
    max_attempts=st.integers(1, 4),
)


@dataclass
class Seen:
    """What the controller has reported so far."""

    fresh_src_checkpoint: bool = False  # verified, written since the migration started
    verified_dst: set[str] = field(default_factory=set)

    def update(self, m: Migration, obs: Observation) -> None:
        ck = obs.src_checkpoint
        if ck is not None and ck.verified and ck.created_at_s >= m.started_s:
            self.fresh_src_checkpoint = True
        if obs.dst_checkpoint is not None and obs.dst_checkpoint.verified:
            self.verified_dst.add(obs.dst_checkpoint.uri)


@settings(max_examples=800, deadline=None)
@given(src_instance=st.sampled_from(["src-0", ""]), steps=ticks, limit=limits)
def test_promises_hold_for_any_observations(
    src_instance: str, steps: list[tuple[Observation, float]], limit: Limits
) -> None:
    m = Migration.planned(
        id="mig-1",
        job_id="job-a",
        src_offer_id=SRC,
        dst_offer_id=DST,
        src_instance_id=src_instance,
        now_s=T,
    )
    now = T
    seen = Seen()
    by_target: dict[tuple[str, int], Launch] = {}  # (offer, attempt) -> the one Launch
    by_id: dict[str, MigrationAction] = {}
    for obs, dt in steps:
        now += dt
        seen.update(m, obs)
        nxt, actions = advance(m, obs, now, limit)

        # pure: the same inputs give the same record and the same requests
        assert advance(m, obs, now, limit) == (nxt, actions)
        # every phase change is an edge of the table; terminal records never move
        assert nxt.phase is m.phase or nxt.phase in TRANSITIONS[m.phase]
        if m.terminal:
            assert (nxt, actions) == (m, [])
        if nxt.phase is not m.phase:
            assert (nxt.attempt, nxt.updated_s) == (0, now)
        assert 0 <= nxt.attempt < limit.max_attempts

        for a in actions:
            assert isinstance(a, RequestCheckpoint | CopyCheckpoint | Launch | Terminate)
            # a request id always names the same action
            assert by_id.setdefault(a.request_id, a) == a
            if isinstance(a, Launch):
                # never more than one Launch per (target, attempt)
                assert by_target.setdefault((a.offer_id, nxt.attempt), a) == a
                if a.offer_id == DST:
                    # only from a copy seen verified at the destination, after that was seen
                    assert nxt.phase is MigrationPhase.PROVISIONING
                    assert a.checkpoint_uri in seen.verified_dst
                else:  # a rollback's relaunch, never on the tick it gives up
                    assert nxt.phase is MigrationPhase.ROLLING_BACK
            if isinstance(a, Terminate) and a.instance_id == src_instance:
                # the source is terminated only once a new verified checkpoint exists
                assert seen.fresh_src_checkpoint
                assert nxt.phase is MigrationPhase.CHECKPOINTING
            if isinstance(a, CopyCheckpoint):
                assert a.dst_offer_id == DST and a.src_uri.startswith("src/")
            if isinstance(a, RequestCheckpoint):
                assert a.instance_id == src_instance != ""
        m = nxt
    # at most `max_attempts` tries at the destination
    tries = {a.request_id for a in by_target.values() if a.offer_id == DST}
    assert len(tries) <= limit.max_attempts
