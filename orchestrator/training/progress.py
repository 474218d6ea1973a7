"""Tell the controller how far the job is: `HELIOTROPE_PROGRESS_FILE` gets
``{"fraction": step / total, "step": step}``, written atomically (temp file + rename), and
with `checkpoint_step` also ``"checkpoint_fraction"``: how far its newest checkpoint is,
which is what a preemption keeps (without it the controller counts none kept).

The local provider turns changes of this file into PROGRESS events; cloud adapters may ship
it through their own channel. Without the variable, reporting does nothing.

`report_kept(step)` updates only the checkpoint: `ResumableRun` calls it after the checkpoint
it takes on a preemption notice, so the steps since the last report are counted kept (it
uses the total of this process's last `report_progress`; before any, it does nothing).
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
    _last[target] = (step, total)
    _write(target, report)


_last: dict[str, tuple[int, int]] = {}  # per progress file: the last (step, total) reported


def report_kept(step: int, path: str | None = None) -> None:
    target = path or os.environ.get("HELIOTROPE_PROGRESS_FILE")
    if not target or target not in _last:
        return
    reported, total = _last[target]
    done = max(reported, step)
    _last[target] = (done, total)
    _write(
        target,
        {
            "fraction": min(1.0, done / total),
            "step": done,
            "checkpoint_fraction": min(1.0, max(0, step) / total),
        },
    )


def _write(target: str, report: dict[str, float | int]) -> None:
    file = Path(target)
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(report))
    os.replace(tmp, file)
