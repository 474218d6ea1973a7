#!/usr/bin/env bash
# `make airflow`: Airflow standalone (API server + UI, scheduler, DAG processor, triggerer)
# on this machine, serving the Heliotrope DAGs in ./dags. SQLite metadata DB, no examples.
#
# Every setting can be overridden from the environment:
#   AIRFLOW_HOME            default: <repo>/airflow_home (git-ignored)
#   AIRFLOW__API__PORT      default: 8080
#   AIRFLOW__API__HOST      default: 127.0.0.1 (this machine only)
#   HELIOTROPE_HOME         what the DAG tasks act on (default ~/.heliotrope, as the CLI)
# Add --print-only to print the settings and exit.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$repo/airflow_home}"
export AIRFLOW__CORE__DAGS_FOLDER="${AIRFLOW__CORE__DAGS_FOLDER:-$repo/dags}"
export AIRFLOW__CORE__LOAD_EXAMPLES="${AIRFLOW__CORE__LOAD_EXAMPLES:-False}"
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${AIRFLOW__DATABASE__SQL_ALCHEMY_CONN:-sqlite:///$AIRFLOW_HOME/airflow.db}"
export AIRFLOW__API__HOST="${AIRFLOW__API__HOST:-127.0.0.1}"
export AIRFLOW__API__PORT="${AIRFLOW__API__PORT:-8080}"
# Task processes report to the API server's execution API: follow the host and port above.
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="${AIRFLOW__CORE__EXECUTION_API_SERVER_URL:-http://127.0.0.1:${AIRFLOW__API__PORT}/execution/}"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS:-admin:admin}"
# New DAGs start unpaused, so the signals and rebalance schedules run from the first minute.
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="${AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION:-False}"
# Look for new and changed DAG files every 30 s (the default is 5 min).
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="${AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL:-30}"
url="http://127.0.0.1:${AIRFLOW__API__PORT}"
passwords="$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated"
cat <<MSG
Heliotrope on Airflow
  UI and REST API:  $url  (health: $url/api/v2/monitor/health)
  user / password:  admin / see $passwords
                    (written when the API server first starts)
  AIRFLOW_HOME:     $AIRFLOW_HOME   (SQLite: $AIRFLOW__DATABASE__SQL_ALCHEMY_CONN)
  DAGs:             $AIRFLOW__CORE__DAGS_FOLDER
  HELIOTROPE_HOME:  ${HELIOTROPE_HOME:-~/.heliotrope}
  Settings:         Variable 'heliotrope' (JSON) and \$HELIOTROPE_HOME/config.yaml
  Credentials:      Connections aws_default, google_cloud_default, electricitymaps_default,
                    watttime_default (optional: entsoe_default, eia_default)
Stop with Ctrl-C.
MSG
if [[ "${1:-}" == "--print-only" ]]; then
  exit 0
fi
mkdir -p "$AIRFLOW_HOME"
exec airflow standalone
