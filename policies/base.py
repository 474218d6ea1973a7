"""The policy contract."""

from __future__ import annotations

from typing import Protocol

from orchestrator.model import Decision, Snapshot


class Policy(Protocol):
    """Decide, for each job, where it should run now.

    Contract: pure (same snapshot, same decision); no I/O, no clock, no randomness that is
    not seeded from the snapshot; jobs left out of the decision keep what they have. The
    planner enforces feasibility (capacity, GPU type), so a policy may be optimistic.
    """

    name: str

    def __call__(self, snapshot: Snapshot) -> Decision: ...
