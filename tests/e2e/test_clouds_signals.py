"""The signals DAG's poll and the rebalance DAG's tick on the clouds world (`world: clouds`
in config.yaml): AWS through moto with botocore hooks at the EC2 API (the spot price
history the poller reads), GCP through the recorded-response Compute Engine endpoint.

The same job, the same clouds, the same provider quotes; only what the poller read from
`DescribeSpotPriceHistory` differs. At 0.20 $/h the AWS L4 is the cheapest spot L4 and the
job launches there; polled at 0.50 $/h (while the provider's own price quote, the prior,
still says 0.20) it launches on GCP's 0.28 $/h L4 instead: the decision follows the polled
sample, through the state store, not the quote the world was built with.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator import airflow_tasks as at
from tests.providers.conftest import AWS_SPOT_L4, GCP_SPOT_L4, CloudFakes, open_cloud_fakes


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CloudFakes]:
    with open_cloud_fakes(monkeypatch, tmp_path) as f:
        f.use_standard_credential_chains(monkeypatch)
        yield f


def spot_history(usd: float) -> Any:
    """DescribeSpotPriceHistory as EC2 answers it: the L4 price in us-east-1a, set an hour ago."""

    def handler(params: dict[str, Any]) -> dict[str, Any]:
        if "g6.xlarge" not in params.get("InstanceTypes", []):
            return {"SpotPriceHistory": [], "NextToken": ""}
        return {
            "SpotPriceHistory": [
                {
                    "AvailabilityZone": "us-east-1a",
                    "InstanceType": "g6.xlarge",
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": f"{usd:.6f}",
                    "Timestamp": datetime.now(UTC) - timedelta(hours=1),
                }
            ],
            "NextToken": "",
        }

    return handler


def place(fakes: CloudFakes, home: Path, polled_usd: float) -> str:
    """Configure the clouds world in `home`, submit one L4 job, let the signals task poll the
    AWS spot price (answered at `polled_usd`), then run one rebalance tick; the offer the
    job was launched on."""
    from orchestrator.live.commands import submit

    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "world": "clouds",
                "policy": "spot-failover",
                "db_url": f"sqlite:///{home}/h.db",
                "clouds": {k: v for k, v in fakes.settings_doc().items() if k != "policy"},
            }
        )
    )
    settings = at.task_settings(
        {"home": str(home), "regions": ["aws:us-east-1"], "sources": ["aws-spot-price"]}
    )
    jobs = home / "jobs.yaml"
    jobs.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": "lm",
                        "work_gpu_hours": 4.0,
                        "gpus": 1,
                        "gpu_types": ["L4"],
                        "throughput": {"L4": 1.0},
                        "start_offset_h": 0,
                        "deadline_h": 48,
                        "home_region": "us-east-1",
                        "checkpoint_size_gb": 0.01,
                        "command": [sys.executable, "train.py"],
                    }
                ]
            }
        )
    )
    with at.heliotrope_home(settings):
        assert submit(jobs) == ["lm"]
    quote = fakes.hooks  # the provider's own quotes keep answering 0.20 (the prior)
    quote.on("ec2:DescribeSpotPriceHistory", spot_history(polled_usd))
    polled = at.poll_signals(settings, family="aws", region="aws:us-east-1")
    assert polled["rows"] > 0, polled
    quote.on("ec2:DescribeSpotPriceHistory", spot_history(0.20))
    out = at.rebalance(settings)
    launched = [e for e in out["events"] if e["kind"] == "launched"]
    assert len(launched) == 1, out
    return str(launched[0]["offer"])


@pytest.mark.timeout(180)
def test_the_polled_spot_price_decides_where_the_job_launches(
    fakes: CloudFakes, tmp_path: Path
) -> None:
    assert place(fakes, tmp_path / "cheap", polled_usd=0.20) == AWS_SPOT_L4
    assert place(fakes, tmp_path / "dear", polled_usd=0.50) == GCP_SPOT_L4


def carbon_move(
    fakes: CloudFakes, home: Path, server: Any, monkeypatch: pytest.MonkeyPatch, bpat_later: float
) -> list[dict[str, Any]]:
    """On the clouds world with `carbon-greedy`: the signals task polls Electricity Maps for
    every region, the rebalance task places the L4 job; the poller then reads `bpat_later`
    for us-west-2's grid and the next rebalance tick acts on it. The second tick's events."""
    from orchestrator.live.commands import submit
    from tests.live.test_signals_drive_decisions import em_history
    from tests.signals.conftest import CREDS
    from tests.signals.server import em_zone_handler

    monkeypatch.setenv("HELIOTROPE_ELECTRICITYMAPS_URL", server.url)
    monkeypatch.setenv("ELECTRICITYMAPS_TOKEN", CREDS["ELECTRICITYMAPS_TOKEN"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(
        yaml.safe_dump(
            {
                "world": "clouds",
                "policy": "carbon-greedy",
                "db_url": f"sqlite:///{home}/h.db",
                "clouds": {k: v for k, v in fakes.settings_doc().items() if k != "policy"},
            }
        )
    )
    regions = ["aws:us-east-1", "aws:us-west-2", "gcp:us-central1", "gcp:europe-west4"]
    settings = at.task_settings(
        {"home": str(home), "regions": regions, "sources": ["electricitymaps"]}
    )
    jobs = home / "jobs.yaml"
    jobs.write_text(
        yaml.safe_dump(
            {
                "jobs": [
                    {
                        "name": "lm",
                        "work_gpu_hours": 4.0,
                        "gpus": 1,
                        "gpu_types": ["L4"],
                        "throughput": {"L4": 1.0},
                        "start_offset_h": 0,
                        "deadline_h": 48,
                        "home_region": "us-east-1",
                        "checkpoint_size_gb": 0.01,
                        "command": [sys.executable, "train.py"],
                    }
                ]
            }
        )
    )
    with at.heliotrope_home(settings):
        assert submit(jobs) == ["lm"]

    def poll(bpat: float) -> None:
        carbon = {"US-NW-BPAT": bpat, "NL": 100.0, "US-MIDA-PJM": 400.0, "US-MIDW-MISO": 500.0}
        server.reset()
        server.add(r"/carbon-intensity/history$", handler=em_history(carbon, datetime.now(UTC)))
        server.add(r"/carbon-intensity/forecast$", handler=em_zone_handler("em_forecast_DE.json"))
        for region in regions:
            assert at.poll_signals(settings, family="carbon", region=region)["rows"] > 0

    poll(50.0)
    first = at.rebalance(settings)
    [launch] = [e for e in first["events"] if e["kind"] == "launched"]
    assert launch["offer"].startswith("aws:us-west-2"), first  # 50 g/kWh, polled
    poll(bpat_later)
    out = at.rebalance(settings)
    return list(out["events"])


@pytest.mark.timeout(240)
def test_a_polled_carbon_rise_moves_the_job_on_the_clouds_world(
    fakes: CloudFakes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.signals.server import serve

    for server in serve():
        moved = carbon_move(fakes, tmp_path / "dirty", server, monkeypatch, bpat_later=900.0)
        planned = [e for e in moved if e["kind"] == "migration" and "planned" in e["detail"]]
        assert planned and planned[0]["offer"].startswith("gcp:europe-west4"), moved
        assert "electricitymaps" in planned[0]["detail"]
        stayed = carbon_move(fakes, tmp_path / "clean", server, monkeypatch, bpat_later=50.0)
        assert not [e for e in stayed if e["kind"] == "migration"], stayed
