"""`python manage.py qcluster`: django-q2's worker, plus the recovery sweeper, the outbox's
delivery loop (webhooks, email) and the retention purge (AGENTRUNS_RETENTION_DAYS).

Wraps django-q2's command (agentruns is listed before django_q, so this one wins): a sweep pass
and the sweeper schedule at start, then a fast sweeper loop in this process, because q2
schedules fire at 30 s granularity at best (../shared/notes/django-q2-measured.md).
A SIGTERM (or Ctrl-C), to this process or to its whole process group, tells every worker
process's run pool to drain at once, then stops q2 as usual (`runtime/workers/pool.py`,
`runtime/workers/stop_signals.py`); `runtime/workers/q2_cluster.py` gives q2 task and result
queues that a worker process killed at any moment cannot wedge; `runtime/workers/claimer.py` has every worker process claim queued
runs straight from PostgreSQL, woken by the starts' NOTIFY. A database outage stops none of its processes: each loop backs off
and carries on when the database is back (`runtime/outages/weather.py`, docs/crashlab.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from django.conf import settings
from django.db import OperationalError, ProgrammingError, connections
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as QClusterCommand
from django_q.signals import post_spawn

from agentruns.runtime.dispatch import stops
from agentruns.runtime.inbox import inbox
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.retention import RetentionLoop
from agentruns.runtime.store import nudges
from agentruns.runtime.waits.due import DueWaitsLoop
from agentruns.runtime.workers import collector, pool, q2_cluster, stop_signals
from agentruns.runtime.workers.claimer import start_claimer
from agentruns.runtime.workers.sweeper import SweeperLoop, ensure_schedule, sweep

log = logging.getLogger(__name__)

LOOP_JOIN_SECONDS = (
    1.0  # the sweeper, delivery and retention loops end their pass, at most this long
)


def exit_without_teardown() -> NoReturn:
    """The cluster has stopped: run the exit handlers (the logs' flush, the tracer's export,
    multiprocessing's) and leave, without the interpreter's teardown of every module this
    process imported, which took 2.3 s of a stop on a loaded 2-core machine (0.5 s for the rest
    of the stop), time a supervisor's stop timeout counts."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Command(QClusterCommand):
    help = "Starts the django-q2 cluster with the agentruns recovery sweeper."

    def add_arguments(self, parser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--no-sweeper", action="store_true", help="Do not run the fast sweeper loop."
        )
        parser.add_argument(
            "--no-deliveries", action="store_true", help="Do not send webhooks and email."
        )

    def handle(self, *args, **options):
        settings.SECRET_KEY  # noqa: B018 - q2 signs tasks with it
        if options.get("cluster_name"):
            os.environ["Q_CLUSTER_NAME"] = options["cluster_name"]
        nudges.IN_WORKER_PROCESS = True
        self.until_database_answers(lambda: (ensure_schedule(), sweep()))
        # the cluster forks from this process: don't hand our connections to the children
        connections.close_all()
        pool.expect_cluster_stop()
        q2_cluster.install()  # a worker killed inside q2's queue must not stop the cluster
        stop_signals.install()  # a stop signal to the whole group stops it as one to this process
        # each worker process claims queued runs itself (PostgreSQL), beside q2's doorbells
        post_spawn.connect(start_claimer, dispatch_uid="agentruns.run_claimer")
        # and hears the stops of the runs it executes (runtime/dispatch/stops.py)
        post_spawn.connect(stops.start_listener, dispatch_uid="agentruns.stop_listener")
        # and carries its runs with a collector tuned for them (runtime/workers/collector.py)
        post_spawn.connect(collector.tune, dispatch_uid="agentruns.collector")
        cluster = Cluster()
        pool.forward_stop_signals(cluster.sig_handler)
        with stop_signals.children_born_deaf():
            cluster.start()
        if options.get("run_once"):
            cluster.stop()
            return
        # started after the fork so no child inherits a thread's locks
        loop = None if options.get("no_sweeper") else SweeperLoop()
        if loop:
            loop.start()
        # timers and timeouts, each fired at its due time (beside the sweeper, which backs it up)
        due_waits = None if options.get("no_sweeper") else DueWaitsLoop()
        if due_waits:
            due_waits.start()
        deliveries = None if options.get("no_deliveries") else inbox().delivery_loop()
        if deliveries:
            deliveries.start()
        retention = RetentionLoop()  # idle while AGENTRUNS_RETENTION_DAYS is 0
        retention.start()
        try:
            while cluster.sentinel.is_alive():
                time.sleep(0.5)
        finally:
            for thread in (loop, due_waits, deliveries, retention):
                if thread:
                    thread.stopped.set()
        for thread in (loop, due_waits, deliveries, retention):
            if thread:
                thread.join(LOOP_JOIN_SECONDS)
        exit_without_teardown()

    @staticmethod
    def until_database_answers(first_pass: Callable[[], object]) -> None:
        """A worker started while the database is away, or before a deploy's `migrate` has made
        the tables this code needs, waits for it instead of exiting: both are another process's
        doing, and both pass."""
        backoff = weather.Backoff(cap=5.0)
        said_behind = False
        while True:
            try:
                first_pass()
                weather.database.passed()
                return
            except Exception as exc:
                if schema_behind(exc):
                    if not said_behind:
                        log.warning(
                            "the database lacks tables or columns this code needs (%s): waiting "
                            "for `manage.py migrate`",
                            str(exc).splitlines()[0],
                        )
                        said_behind = True
                elif is_infrastructure_error(exc):
                    weather.database.noticed(exc, "qcluster's start")
                else:
                    raise
                connections.close_all()
                time.sleep(backoff.next())


# PostgreSQL: undefined table, column or function; SQLite says it in words
_SCHEMA_BEHIND_SQLSTATES = ("42P01", "42703", "42883")
_SCHEMA_BEHIND_SQLITE = ("no such table", "no such column", "has no column named")


def schema_behind(exc: BaseException) -> bool:
    """True when `exc` says a table, column or function of this code's migrations is missing."""
    if isinstance(exc, ProgrammingError):
        return getattr(exc.__cause__, "sqlstate", None) in _SCHEMA_BEHIND_SQLSTATES
    return isinstance(exc, OperationalError) and str(exc).startswith(_SCHEMA_BEHIND_SQLITE)
