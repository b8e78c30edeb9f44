"""Retention: finished runs older than a cut-off are deleted with everything kept for them
(`manage.py purge_runs --older-than 90d`, and hourly by the worker with
AGENTRUNS_RETENTION_DAYS).

A run is purged once it finished (succeeded, failed or cancelled) before the cut-off, by
`finished_at`; a queued, running or waiting run never is, however old. With it go its steps,
their attempts, its events and the inbox's rows for it: its items with their decisions and mail
notices (foreign keys to the run and its steps, followed by Django's cascade whatever app
declares them, so a table added later goes too) and its webhook deliveries that were sent or
given up (no foreign key: `inbox().forget_runs`). The demo's own business records that name a
run (support's customer replies, the gateway's refunds) are the domain's, not the run's: kept.

In batches of `BATCH` runs, one transaction each, so no table is locked for long: a batch's runs
are locked (`FOR UPDATE SKIP LOCKED` on PostgreSQL: a run somebody is retrying right then is
left for the next pass; SQLite's IMMEDIATE transactions serialise the writers) and re-checked
finished in the same statement. A dry run walks the same batches and counts what the delete
would remove, table by table, deleting nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import close_old_connections, connection, transaction
from django.db.models import Q, QuerySet
from django.db.models.deletion import Collector
from django.utils import timezone

from agentruns.backoff import jittered
from agentruns.conf import conf
from agentruns.models import TERMINAL_RUN_STATUSES, Run
from agentruns.runtime.access.quotas import take
from agentruns.runtime.inbox import inbox
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import OwnedThread

log = logging.getLogger(__name__)

BATCH = 500  # runs per transaction
RUNS_TABLE = Run._meta.db_table


def purge(
    older_than: timedelta,
    *,
    dry_run: bool = False,
    batch: int = BATCH,
    now: datetime | None = None,
) -> Counter[str]:
    """Delete (or only count: `dry_run`) the runs that finished more than `older_than` before
    `now`, with their rows; returns the rows per table (the runs under `RUNS_TABLE`)."""
    cutoff = (now or timezone.now()) - older_than
    counts: Counter[str] = Counter()
    after: tuple[Any, Any] | None = None  # the last batch's (created_at, id): the next follow it
    while True:
        with transaction.atomic():
            rows = _next_batch(cutoff, batch, after)
            if not rows:
                return counts
            ids = [run_id for run_id, _ in rows]
            counts.update(inbox().forget_runs(ids, dry_run=dry_run))
            counts.update(_runs_with_their_rows(ids, cutoff, dry_run))
        after = rows[-1][1], rows[-1][0]


def _next_batch(cutoff: datetime, batch: int, after: tuple[Any, Any] | None) -> list[tuple]:
    """The next `batch` finished runs before `cutoff`, oldest first, locked. `created_at` before
    the cut-off too (a run finishes after it was created): the (status, created_at) index
    finds them without reading the runs that stay."""
    runs = Run.objects.filter(
        status__in=TERMINAL_RUN_STATUSES, created_at__lt=cutoff, finished_at__lt=cutoff
    )
    if after is not None:
        runs = runs.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
    runs = runs.select_for_update(skip_locked=True).order_by("created_at", "id")
    return list(runs.values_list("id", "created_at")[:batch])


def _runs_with_their_rows(ids: list, cutoff: datetime, dry_run: bool) -> dict[str, int]:
    runs = Run.objects.filter(id__in=ids, status__in=TERMINAL_RUN_STATUSES, finished_at__lt=cutoff)
    if dry_run:
        return _would_delete(runs)
    _, by_model = runs.delete()
    return {apps.get_model(label)._meta.db_table: n for label, n in by_model.items() if n}


def _would_delete(runs: QuerySet) -> dict[str, int]:
    """What `runs.delete()` would remove, per table, by the same cascade (Django's collector)."""
    collector = Collector(using=runs.db, origin=runs)
    collector.collect(runs)
    counts: Counter[str] = Counter()
    for model, instances in collector.data.items():
        counts[model._meta.db_table] += len(instances)
    for rows in collector.fast_deletes:
        counts[rows.model._meta.db_table] += (
            rows.count() if isinstance(rows, QuerySet) else len(rows)
        )
    return {table: n for table, n in counts.items() if n}


def report(counts: Counter[str]) -> list[str]:
    """The counts as lines, the runs first, then every other table by name."""
    tables = sorted(counts, key=lambda table: (table != RUNS_TABLE, table))
    width = max((len(table) for table in tables), default=0)
    return [f"{table:<{width}}  {counts[table]:>9}" for table in tables]


# ------------------------------------------------------------------ the worker's hourly purge
PURGE_EVERY_SECONDS = 3600  # one purge an hour across every worker (a shared bucket)
LOOK_EVERY_SECONDS = 300  # each worker asks that often whether it is its turn
BUCKET = "retention:purge"


def purge_due() -> Counter[str] | None:
    """The worker's turn, if it is one: with AGENTRUNS_RETENTION_DAYS set and no purge by any
    worker in the last hour (one statement on a shared bucket decides, race-free), purge.
    None: not this worker's turn (or retention is off)."""
    days = conf.RETENTION_DAYS
    if days <= 0 or take(BUCKET, burst=1, per_second=1 / PURGE_EVERY_SECONDS) > 0:
        return None
    counts = purge(timedelta(days=days))
    if counts:
        log.info(
            "retention: deleted runs finished more than %g days ago: %s",
            days,
            ", ".join(f"{table} {n}" for table, n in counts.items()),
        )
    return counts


class RetentionLoop(OwnedThread):
    """In `qcluster`, beside the sweeper: a purge when it is this worker's turn (on its own
    thread: a long first purge must not hold up the sweeps that recover killed workers' runs)."""

    name = "agentruns-retention"

    def run(self) -> None:
        backoff = weather.Backoff(base=1.0, cap=60.0)
        wait = 0.0  # the first look at start, as the sweeper's first pass
        while not self.stopped.wait(wait):
            wait = jittered(LOOK_EVERY_SECONDS, 0.2)
            try:
                close_old_connections()
                purge_due()
                backoff.reset()
            except Exception as exc:
                if not is_infrastructure_error(exc):
                    log.warning("retention: the purge failed", exc_info=True)
                else:
                    weather.database.noticed(exc, "the retention purge")
                    wait = backoff.next()
            connection.close()
