"""Tell the controller how far the job is: `HELIOTROPE_PROGRESS_FILE` gets
``{"fraction": step / total, "step": step}``, written atomically (temp file + rename), and
with `checkpoint_step` also ``"checkpoint_fraction"``: how far its newest checkpoint is,
which is what a preemption keeps (without it the controller counts none kept).

The local provider turns changes of this file into PROGRESS events; cloud adapters may ship
it through their own channel. Without the variable, reporting does nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def report_progress(
    step: int, total: int, path: str | None = None, *, checkpoint_step: int | None = None
) -> None:
    target = path or os.environ.get("HELIOTROPE_PROGRESS_FILE")
    if not target or total <= 0:
        return
    report: dict[str, float | int] = {"fraction": min(1.0, step / total), "step": step}
    if checkpoint_step is not None:
        report["checkpoint_fraction"] = min(1.0, max(0, checkpoint_step) / total)
    file = Path(target)
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, file)
