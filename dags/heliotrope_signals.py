"""Heliotrope signals: poll GPU prices, spot capacity, grid carbon and power every 5 minutes.

One task per source family (aws, gcp, carbon, power), mapped over the regions to watch (the
Variable ``heliotrope``'s ``regions``, else the live world's four): each mapped task polls
its family's sources for one region, appends the samples to the state store and to the
trace directory (``$HELIOTROPE_HOME/signals`` unless the Variable says ``trace_dir``), and
is skipped, with the reason, when no source covers the region or none has a credential.

Credentials come from the Connections ``aws_default``, ``google_cloud_default``,
``electricitymaps_default``, ``watttime_default`` (and optionally ``entsoe_default``,
``eia_default``), read when a task runs; unset ones fall back to the environment.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import TaskGroup, dag, get_current_context, task

from orchestrator import airflow_tasks as heliotrope


@dag(
    dag_id="heliotrope_signals",
    description="Poll Heliotrope's live signals into the state store and the trace dir",
    schedule="*/5 * * * *",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=10),
    default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
    tags=["heliotrope"],
    doc_md=__doc__,
)
def heliotrope_signals() -> None:
    @task
    def regions(family: str) -> list[str]:
        """The regions (``cloud:region``) this family's sources are polled for."""
        return heliotrope.in_airflow(heliotrope.signal_regions, family=family)

    @task(execution_timeout=timedelta(minutes=4), map_index_template="{{ region }}")
    def poll(family: str, region: str) -> dict[str, Any]:
        """One family's sources for one region: samples to the store and the trace dir."""
        get_current_context()["region"] = region  # type: ignore[typeddict-unknown-key]
        return heliotrope.in_airflow(
            heliotrope.poll_signals,
            family=family,
            region=region,
            credentials=heliotrope.airflow_credentials(),
        )

    for family in heliotrope.SIGNAL_FAMILIES:
        with TaskGroup(group_id=family, tooltip=", ".join(heliotrope.SIGNAL_FAMILIES[family])):
            poll.partial(family=family).expand(region=regions(family))


heliotrope_signals()
