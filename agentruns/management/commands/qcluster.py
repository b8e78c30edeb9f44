"""`python manage.py qcluster`: django-q2's worker, plus the recovery sweeper, the outbox's
delivery loop (webhooks, email) and the retention purge (AGENTRUNS_RETENTION_DAYS).

Wraps django-q2's command (agentruns is listed before django_q, so this one wins): a sweep pass
and the sweeper schedule at start, then a fast sweeper loop in this process, because q2
schedules fire at 30 s granularity at best (../shared/notes/django-q2-measured.md).
A SIGTERM (or Ctrl-C) tells every worker process's run pool to drain at once, then stops q2 as
usual (`runtime/workers/pool.py`); `runtime/workers/q2_cluster.py` gives q2 task and result
queues that a worker process killed at any moment cannot wedge; `runtime/workers/claimer.py` has every worker process claim queued
runs straight from PostgreSQL, woken by the starts' NOTIFY. A database outage stops none of its processes: each loop backs off
and carries on when the database is back (`runtime/outages/weather.py`, docs/crashlab.md).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections
from django_q.cluster import Cluster
from django_q.management.commands.qcluster import Command as QClusterCommand
from django_q.signals import post_spawn

from agentruns.runtime.inbox import inbox
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.retention import RetentionLoop
from agentruns.runtime.store import nudges
from agentruns.runtime.workers import collector, pool, q2_cluster
from agentruns.runtime.workers.claimer import start_claimer
from agentruns.runtime.workers.sweeper import SweeperLoop, ensure_schedule, sweep


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
        # each worker process claims queued runs itself (PostgreSQL), beside q2's doorbells
        post_spawn.connect(start_claimer, dispatch_uid="agentruns.run_claimer")
        # and carries its runs with a collector tuned for them (runtime/workers/collector.py)
        post_spawn.connect(collector.tune, dispatch_uid="agentruns.collector")
        cluster = Cluster()
        pool.forward_stop_signals(cluster.sig_handler)
        cluster.start()
        if options.get("run_once"):
            cluster.stop()
            return
        # started after the fork so no child inherits a thread's locks
        loop = None if options.get("no_sweeper") else SweeperLoop()
        if loop:
            loop.start()
        deliveries = None if options.get("no_deliveries") else inbox().delivery_loop()
        if deliveries:
            deliveries.start()
        retention = RetentionLoop()  # idle while AGENTRUNS_RETENTION_DAYS is 0
        retention.start()
        try:
            while cluster.sentinel.is_alive():
                time.sleep(0.5)
        finally:
            retention.stopped.set()
            if loop:
                loop.stopped.set()
            if deliveries:
                deliveries.stopped.set()

    @staticmethod
    def until_database_answers(first_pass: Callable[[], object]) -> None:
        """A worker started while the database is away waits for it instead of exiting."""
        backoff = weather.Backoff(cap=5.0)
        while True:
            try:
                first_pass()
                weather.database.passed()
                return
            except Exception as exc:
                if not is_infrastructure_error(exc):
                    raise
                weather.database.noticed(exc, "qcluster's start")
                connections.close_all()
                time.sleep(backoff.next())
