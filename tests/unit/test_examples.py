"""Every documented example file works as its header and the README say."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"


def test_every_example_the_docs_name_exists() -> None:
    named = set()
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        named |= set(re.findall(r"docs/examples/[\w.-]+\.yaml", doc.read_text()))
    assert named, "the docs name no example"
    for path in sorted(named):
        assert (REPO / path).is_file(), f"{path} is named in the docs but missing"
    assert {p.name for p in EXAMPLES.glob("*.yaml")} <= {Path(n).name for n in named}


def test_demo_jobs_replay_on_the_built_in_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "replay",
                "--jobs",
                str(EXAMPLES / "demo-jobs.yaml"),
                "--policies",
                "on-demand",
                "--out",
                str(tmp_path / "o"),
                "--json",
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["policies"]["on-demand"]["usd"] > 0


def test_local_jobs_submit_and_launch_on_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("signals: scenario\n")  # as its header says
    monkeypatch.setenv("HELIOTROPE_HOME", str(home))
    monkeypatch.chdir(REPO)  # "from the repository root"
    assert main(["jobs", "submit", "docs/examples/local-jobs.yaml"]) == 0
    assert "submitted 2 job(s): lm-east, lm-eu" in capsys.readouterr().out
    from orchestrator.live.world import open_configured_store

    jobs, _ = open_configured_store().load()
    for job in jobs.jobs:
        script = Path(job.command[1])
        assert script.is_absolute() and script == REPO / "examples" / "train_lm.py"
