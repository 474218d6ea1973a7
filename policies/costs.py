"""Moved to `orchestrator.costs` (issue 19): the cost model sits below the policies and the
loop. This name stays only for `orchestrator.replay`, which is switched to the new module
with its split; import `orchestrator.costs` in new code."""

from __future__ import annotations

from orchestrator.costs import (
    JobOfferFit,
    MoveCost,
    egress_per_gb,
    marginal_intensity,
    move_cost,
    objective_usd,
    relative_throughput,
    transfer_h_per_gb,
)

__all__ = [
    "JobOfferFit",
    "MoveCost",
    "egress_per_gb",
    "marginal_intensity",
    "move_cost",
    "objective_usd",
    "relative_throughput",
    "transfer_h_per_gb",
]
