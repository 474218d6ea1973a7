"""Heliotrope rebalance: one controller tick every 15 minutes.

The same tick as ``heliotrope controller run --once``: reload the fleet from the state store,
advance open migrations, let the policy decide, act, record. The run is skipped, with the
reason in the task log, when the signals the policy would decide on are stale. Runs never
overlap (one active run, one running tick).

Settings: ``$HELIOTROPE_HOME/config.yaml`` and the Variable ``heliotrope`` (see
``orchestrator.airflow_tasks.TaskSettings``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import dag, task

from orchestrator import airflow_tasks as heliotrope


@dag(
    dag_id="heliotrope_rebalance",
    description="One Heliotrope controller tick: observe, decide, move, record",
    schedule="*/15 * * * *",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=14),
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["heliotrope"],
    doc_md=__doc__,
)
def heliotrope_rebalance() -> None:
    @task(max_active_tis_per_dag=1, execution_timeout=timedelta(minutes=10))
    def tick() -> dict[str, Any]:
        """One `LiveController.tick`; skipped when the signals are stale."""
        return heliotrope.in_airflow(heliotrope.rebalance)

    tick()


heliotrope_rebalance()
