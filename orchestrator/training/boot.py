"""Wait for the instance's start-up to end before the first step.

A provider that emulates a start-up (the local provider with `emulate_startup`, as the
demo runs it) gives the job `HELIOTROPE_READY_AT`, the wall-clock epoch second its instance
is ready: the job's own start (imports, restore) runs inside that time and its first step
waits for the rest, so its progress is what the launch's declared start-up predicts.
Without the variable (every real cloud, the local provider by default) it does nothing.
"""

from __future__ import annotations

import logging
import math
import os
import time

READY_AT_ENV = "HELIOTROPE_READY_AT"

logger = logging.getLogger(__name__)


def wait_until_ready(ready_at: str | None = None) -> float:
    """Sleep until the instance's ready time; return the seconds slept (0 when it has
    passed, or when none is given). A value that is not a finite number is ignored with a
    warning: the job runs rather than hangs."""
    raw = ready_at if ready_at is not None else os.environ.get(READY_AT_ENV)
    if not raw:
        return 0.0
    try:
        when = float(raw)
    except ValueError:
        when = math.nan
    if not math.isfinite(when):
        logger.warning("%s=%r is not an epoch time in seconds; not waiting", READY_AT_ENV, raw)
        return 0.0
    wait = when - time.time()
    if wait <= 0:
        return 0.0
    time.sleep(wait)
    return wait
