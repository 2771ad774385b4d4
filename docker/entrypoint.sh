#!/usr/bin/env bash
# Entrypoint of the pyflink-aisp images (docker/Dockerfile) and of the Flink
# Kubernetes Operator's pods. Every role is configured by pyflink_aisp.local, the
# code that configures the local stack (`aisp local up`), from AISP_* variables
# (pyflink_aisp/deploy/_container.py: CONTAINER_ENV):
#   entrypoint.sh jobmanager|taskmanager|kafka|submit   configure, then run the role in the foreground
#   entrypoint.sh config ROLE                           only write the role's config (tests run this)
#   entrypoint.sh kubernetes-jobmanager.sh ...          native Kubernetes (operator): Flink's own bin/ script
#   entrypoint.sh CMD ...                               any other command, as it is
set -euo pipefail

python=${AISP_PYTHON:-python}
role=${1:-}
case "$role" in
  jobmanager|taskmanager|kafka|submit)
    exec "$python" -m pyflink_aisp.cli container run "$role" ;;
  config)
    shift
    exec "$python" -m pyflink_aisp.cli container config "$@" ;;
  kubernetes-*.sh)
    # The operator starts JobManager and TaskManager pods with `<entry> kubernetes-jobmanager.sh ARGS`
    # (kubernetes.entry.path) and mounts its own config.yaml at $FLINK_CONF_DIR.
    shift
    exec bash "${FLINK_HOME:?FLINK_HOME is not set}/bin/$role" "$@" ;;
  "")
    echo "usage: entrypoint.sh jobmanager|taskmanager|kafka|submit | config ROLE | CMD ..." >&2
    exit 2 ;;
  *)
    exec "$@" ;;
esac
