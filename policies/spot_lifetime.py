"""How long a spot offer that is available now is expected to stay available.

Estimated from the offer's own availability history up to now (never after): uptime runs
are survival data, completed runs are events and the current run is censored. Under a
constant hazard the maximum-likelihood rate is ``events / total uptime`` (the exponential
special case of Kaplan-Meier; it needs no per-run bookkeeping and vectorizes over offers).
A prior of one run of `prior_hours` keeps offers with little history sensible.
"""

from __future__ import annotations

import numpy as np

from orchestrator.model import FloatArray


def expected_lifetime_h(
    available: FloatArray, tick_h: float, *, prior_hours: float = 6.0
) -> FloatArray:
    """`available` is [time, offer] (1/0, NaN unknown), newest row last; returns hours per
    offer: expected remaining availability (inf for offers never seen unavailable and no
    history, i.e. on-demand columns of inf capacity)."""
    up = np.nan_to_num(available, nan=0.0) > 0
    uptime_h = up.sum(axis=0) * tick_h
    ends = (up[:-1] & ~up[1:]).sum(axis=0) if up.shape[0] > 1 else np.zeros(up.shape[1])
    rate = (ends + 1.0) / (uptime_h + prior_hours)
    result: FloatArray = 1.0 / rate
    return result
