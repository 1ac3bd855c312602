#!/usr/bin/env bash
# Wait for the job of a Docker Swarm stack (a service that runs once, e.g. gw_trainer0 of
# deploy/stack.yml) and exit with its exit code: what `docker compose up --exit-code-from` does
# for compose, which `docker stack deploy` has no flag for.
#
#   deploy/stack-job.sh [--timeout SECONDS] SERVICE      (default timeout: 3600 s)
#
# Prints "SERVICE: <state>, exit code N" (and the task's error, if any). Exit codes: the job's
# own, 124 when it did not end within the timeout, 2 for bad arguments or an unknown service.
set -euo pipefail

timeout=3600
usage() { echo "usage: $0 [--timeout SECONDS] SERVICE" >&2; exit 2; }
while [ "$#" -gt 0 ]; do
  case "$1" in
    --timeout) [ "$#" -ge 2 ] || usage; timeout="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ "$#" -eq 1 ] || usage
case "$timeout" in ''|*[!0-9]*) echo "$0: --timeout wants whole seconds, not '$timeout'" >&2; exit 2 ;; esac
service="$1"

if ! docker service inspect "$service" >/dev/null 2>&1; then
  echo "$0: no service '$service' (docker service ls lists them; stack services are STACK_NAME)" >&2
  exit 2
fi

deadline=$((SECONDS + timeout))
while :; do
  # The newest task of the service (a job runs once: restart_policy none).
  task="$(timeout 30 docker service ps -q --no-trunc "$service" | head -n1)"
  if [ -n "$task" ]; then
    state="$(timeout 30 docker inspect --format '{{.Status.State}}' "$task")"
    case "$state" in
      complete|failed|rejected|shutdown|orphaned|remove)
        code="$(timeout 30 docker inspect --format '{{with .Status.ContainerStatus}}{{.ExitCode}}{{end}}' "$task")"
        err="$(timeout 30 docker inspect --format '{{.Status.Err}}' "$task")"
        echo "$service: $state, exit code ${code:-none}${err:+ ($err)}"
        [ -n "$code" ] || exit 1
        exit "$code"
        ;;
    esac
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "$service: still ${state:-without a task} after $timeout s" >&2
    exit 124
  fi
  sleep 2
done
