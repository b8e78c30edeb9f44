#!/usr/bin/env bash
# Start qcluster in its own process group and forward SIGTERM/SIGINT to its main PID only:
# django-q2 deadlocks when its whole process group gets SIGTERM (a process manager's default,
# honcho's included), but shuts down cleanly when only the main process is signalled.
set -u
cd "$(dirname "$0")/.."
setsid "${PYTHON:-.venv/bin/python}" manage.py qcluster "$@" &
pid=$!
trap 'kill -TERM "$pid" 2>/dev/null' TERM INT
wait "$pid"
status=$?
# wait again: the first wait returns early when a trapped signal arrives
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; status=$?; done
exit "$status"
