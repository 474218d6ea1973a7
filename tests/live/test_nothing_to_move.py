"""A job with no live instance and no verified checkpoint has nothing to move: the move
fails once, and the job starts over where it was sent, instead of the same failing move
being planned every tick (the demo's lm-eu, preempted before its first checkpoint, planned
it 40 times)."""

from __future__ import annotations

from orchestrator.live.commands import ManualMove
from orchestrator.migration import NOTHING_TO_MOVE
from orchestrator.model import EventKind
from policies.registry import make_policy
from tests.live.test_driver_takeover import make_world
from tests.state.conftest import Backend


def test_no_checkpoint_anywhere_starts_over_at_the_destination(backend: Backend) -> None:
    w = make_world(backend)
    live = w.controller()
    live.tick()
    assert live.controller is not None
    src = w.grid.offers[int(live.controller.fleet.offer[0])]
    dst = next(
        k for k, o in enumerate(w.grid.offers) if o.region != src.region and o.market is src.market
    )

    def tell(policy: object) -> None:
        live.policy = policy  # type: ignore[assignment]
        live.controller = None  # reload from the store, as a new tick of the CLI would
        w.tick(live)

    tell(ManualMove(0, None, "test: stop it"))  # stopped; no checkpoint was ever written
    assert not [i for i in w.live().values() if not i.state.value.endswith("ed")]
    for _ in range(4):
        tell(ManualMove(0, dst, "test: move it"))

    moves = [e.detail for e in live.store.history("j0") if e.kind is EventKind.MIGRATION]
    assert sum("planned ->" in d for d in moves) == 1, moves  # one failed move, not one a tick
    assert any(NOTHING_TO_MOVE in d for d in moves)
    launches = [e for e in live.store.history("j0") if e.kind is EventKind.LAUNCHED]
    assert launches[-1].offer_id == w.grid.offers[dst].id  # started over there
    assert live.controller is not None
    assert live.controller.fleet.checkpoint_offer[0] == dst  # its next checkpoint lies there
    live.policy = make_policy("on-demand")
