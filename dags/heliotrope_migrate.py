"""Heliotrope migrate: move one job to another region, from a form.

The same checks and refusals as ``heliotrope migrate JOB --to REGION``: an unknown job, a
finished job, a job already moving, a region with no offer the job may use, and, unless
*force* is ticked, a move that would miss the job's deadline or break its budget. A refused
move fails the run (no retries) with the reason in the task log. A *dry run* (the default)
returns the plan and changes nothing; otherwise the move starts through the controller's own
tick and the migration machine, and the rebalance DAG carries it on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from airflow.sdk import Param, dag, task

from orchestrator import airflow_tasks as heliotrope


@dag(
    dag_id="heliotrope_migrate",
    description="Move one Heliotrope job to another region (manual, with a form)",
    schedule=None,
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    tags=["heliotrope"],
    doc_md=__doc__,
    params={
        "job": Param(
            type="string",
            minLength=1,
            title="Job",
            description="The id of a submitted job (`heliotrope jobs list`).",
        ),
        "region": Param(
            type="string",
            minLength=1,
            title="Target region",
            description="Where the job should run next.",
            examples=list(heliotrope.LOCAL_REGION_NAMES),
        ),
        "market": Param(
            "current",
            type="string",
            enum=list(heliotrope.MARKET_CHOICES),
            title="Market",
            values_display={
                "current": "the job's current market",
                "spot": "spot",
                "on_demand": "on-demand",
            },
        ),
        "dry_run": Param(
            True,
            type="boolean",
            title="Dry run",
            description="Only plan the move: what it costs, how long it takes; change nothing.",
        ),
        "force": Param(
            False,
            type="boolean",
            title="Force",
            description="Move even if the job would miss its deadline or break its budget.",
        ),
    },
)
def heliotrope_migrate() -> None:
    @task(retries=0)
    def migrate(params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Plan, and unless a dry run start, the move; returns the plan."""
        return heliotrope.in_airflow(heliotrope.migrate, **(params or {}))

    migrate()


heliotrope_migrate()
