"""Replay on the real traces of ../shared/data through the documented example jobs file
(issue #2's "done when"); skipped with a reason when the traces are absent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.conftest import REPO

BASELINES = "on-demand,spot-failover,uniform-progress,carbon-greedy,curtailment-threshold"


@pytest.fixture(scope="module")
def imported(shared_data_module: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    assert main(["traces", "import", str(shared_data_module), "--out", str(out)]) == 0
    return out


def test_baselines_on_real_traces(
    imported: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = main(
        [
            "replay",
            "--traces",
            str(imported),
            "--jobs",
            str(REPO / "docs" / "examples" / "jobs.yaml"),
            "--policies",
            BASELINES,
            "--out",
            str(tmp_path / "out"),
            "--json",
        ]
    )
    assert code == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    assert set(policies) == set(BASELINES.split(","))
    on_demand = policies["on-demand"]["usd"]
    for name, row in policies.items():
        assert row["usd"] <= on_demand + 1e-6, f"{name} costs more than on-demand"
    up = policies["uniform-progress"]
    assert up["deadlines_missed"] == 0 and up["deadlines_met"] > 0
    assert policies["spot-failover"]["preemptions"] > 0  # the real V100 traces preempt
    assert policies["carbon-greedy"]["kg_co2"] < policies["on-demand"]["kg_co2"]
