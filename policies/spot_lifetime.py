"""How long a spot offer that is available now is expected to stay available.

Estimated from the offer's own availability history up to now (never after): uptime runs
are survival data, completed runs are events and the current run is censored. Under a
constant hazard the maximum-likelihood rate is ``events / total uptime`` (the exponential
special case of Kaplan-Meier; it needs no per-run bookkeeping and vectorizes over offers).
Recent history counts more: each tick is weighted by ``0.5 ** (age / halflife)``, so a zone
that has been flickering for the last hours is expected to flicker on, whatever it did last
week. A prior of one run of `prior_hours` keeps offers with little history sensible.
"""

from __future__ import annotations

import numpy as np

from orchestrator.model import FloatArray


def expected_lifetime_h(
    available: FloatArray,
    tick_h: float,
    *,
    prior_hours: float = 6.0,
    halflife_h: float = 12.0,
) -> FloatArray:
    """`available` is [time, offer] (capacity; > 0 available, 0 not, NaN unknown), newest
    row last; returns the expected remaining availability in hours per offer."""
    up = np.nan_to_num(available, nan=0.0) > 0
    n = up.shape[0]
    age_h = (n - 1 - np.arange(n)) * tick_h
    weight = 0.5 ** (age_h / halflife_h) if halflife_h > 0 else np.ones(n)
    uptime_h = (up * weight[:, None]).sum(axis=0) * tick_h
    ends = ((up[:-1] & ~up[1:]) * weight[1:, None]).sum(axis=0) if n > 1 else np.zeros(up.shape[1])
    rate = (ends + 1.0) / (uptime_h + prior_hours)
    result: FloatArray = 1.0 / rate
    return result
