"""Heliotrope replay: what would these jobs have cost, and emitted, under each policy?

``heliotrope replay`` as a task (the same replay service, `orchestrator.replay.service`):
the jobs file replayed over a trace directory (empty: the built-in scenario; a directory the
signals DAG wrote is replayed as the live controller knew it) under each policy, with carbon
priced in the objective. The report's
path is in the task log and in XCom (``return_value["report"]``), next to results.json and
timeline.csv, under ``$HELIOTROPE_HOME/replays/<run id>`` unless an output dir is given.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import Param, dag, task

from orchestrator import airflow_tasks as heliotrope

DEMO_JOBS = Path(__file__).absolute().parents[1] / "docs" / "examples" / "demo-jobs.yaml"


@dag(
    dag_id="heliotrope_replay",
    description="Replay policies over a trace: cost, carbon, deadlines, report",
    schedule=None,
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    tags=["heliotrope"],
    doc_md=__doc__,
    params={
        "trace_dir": Param(
            "",
            type="string",
            title="Trace directory",
            description="A trace directory (docs/traces.md); empty: the built-in scenario.",
        ),
        "jobs_file": Param(
            str(DEMO_JOBS),
            type="string",
            minLength=1,
            title="Jobs file",
            description="The jobs to replay (docs/jobs.md).",
        ),
        "window_start": Param(
            "",
            type="string",
            title="Window start",
            description="ISO time, e.g. 2024-04-01T00:00:00Z; empty: the trace's start. "
            "Jobs given by start_offset_h start from here.",
        ),
        "window_days": Param(
            None,
            type=["null", "number"],
            exclusiveMinimum=0,
            title="Window length (days)",
            description="Replay the jobs that start in this window; for the built-in "
            "scenario also its length (empty: 14 days, every job).",
        ),
        "policies": Param(
            list(heliotrope.DEFAULT_REPLAY_POLICIES),
            type="array",
            items={"type": "string", "enum": list(heliotrope.REPLAY_POLICY_CHOICES)},
            minItems=1,
            title="Policies",
            examples=list(heliotrope.REPLAY_POLICY_CHOICES),
        ),
        "carbon_price": Param(
            0.0,
            type="number",
            minimum=0,
            title="Carbon price (USD per tonne CO2)",
            description="Price of carbon in the objective; 0 = pure cost.",
        ),
        "seed": Param(0, type="integer", title="Seed"),
        "tick_minutes": Param(10, type="number", exclusiveMinimum=0, title="Tick (minutes)"),
        "out_dir": Param(
            "",
            type="string",
            title="Output directory",
            description="Empty: $HELIOTROPE_HOME/replays/<run id>.",
        ),
    },
)
def heliotrope_replay() -> None:
    @task(retries=0, execution_timeout=timedelta(hours=2))
    def replay(params: dict[str, Any] | None = None, run_id: str | None = None) -> dict[str, Any]:
        """Run the replay; the XCom is the report's path and the per-policy totals."""
        return heliotrope.in_airflow(heliotrope.replay, run_id=run_id or "", **(params or {}))

    replay()


heliotrope_replay()
