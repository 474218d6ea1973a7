"""`make demo` end to end, as a new user runs it: real training processes in four local
regions on the built-in scenario, moved by the policy, then the replay of the same period.

It asserts what the demo claims, not its figures (they depend on this machine's load): every
job finishes, a polled signal (not only a spot reclaim) moves a job and the log names it,
the replay's report marks the policy that missed its deadlines, and the demo compares the
live fleet with its replay, naming where they part when they do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SIGNAL_MOVE = re.compile(r"moves to\s+\S+ \((spot|od)\): (carbon|price|curtail)")


def test_the_demo_moves_jobs_on_signals_and_compares_the_live_run_with_its_replay(
    tmp_path: Path,
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo", "--home", str(tmp_path)],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("HELIOTROPE_")}},
    )
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert re.search(r"lm-eu\s+finished", out) and re.search(r"lm-east\s+finished", out)
    assert SIGNAL_MOVE.search(out), "no move decided by a signal:\n" + out[-4000:]
    assert "The same period, replayed" in out
    assert "heliotrope: the live run against its replay" in out
    agreed = "The replay agrees with the live run within 5%" in out
    assert agreed or "They first part at" in out  # never a silent disagreement

    results = json.loads((tmp_path / "replay" / "results.json").read_text())
    policies = results["policies"]
    assert policies["heliotrope"]["deadlines_missed"] == 0
    assert policies["heliotrope"]["deadlines_met"] == 3
    report = (tmp_path / "replay" / "report.html").read_text()
    for name, row in policies.items():
        if row["deadlines_missed"]:  # marked in the table, by name
            flag = f'<span class="flag">✗ missed {row["deadlines_missed"]}</span>'
            assert f"{name} {flag}" in report
