"""django-q2's ORM broker as the runs' doorbell: first in, first out, and able to ring later.

Configured as `Q_CLUSTER["broker_class"]` (config/settings.py). Three changes to q2's ORM broker:
- `get_connection` keeps a working connection: q2's calls `close_old_connections()` before
  every broker operation, which with a connection pool (CONN_MAX_AGE=0) gives the connection
  back and takes it again, health check included, twice per dequeued task: that, not the
  database, limited the pick-up rate to ~55 doorbells/s. A connection that had an error is
  still checked and replaced, as Django does;
- `dequeue` takes the oldest task (q2's takes whatever the database returns first, which after
  deletes is no particular order), so runs start roughly in the order they were queued, and
  takes it in one statement (q2's: a SELECT, then a compare-and-set UPDATE per task); on
  PostgreSQL `FOR UPDATE SKIP LOCKED` keeps concurrent clusters off each other's tasks;
- `ring_at(when)` gives a broker whose tasks become visible only at `when`: the ORM broker's
  `lock` column ("nobody may pull this before") is the delay. A run waiting for a retry backoff
  holds no thread: it is re-queued with such a doorbell (`queue.enqueue(not_before=...)`).

Imported by q2 (by its dotted path) and by `queue.enqueue`, never at module level of the
runtime: q2 reads its settings on import.
"""

from __future__ import annotations

import time
from datetime import datetime

from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ


class DoorbellBroker(ORM):
    not_before: datetime | None = None

    @staticmethod
    def get_connection(list_key: str | None = None) -> QuerySet[OrmQ]:
        db = connections[Conf.ORM]
        if db.connection is not None and db.errors_occurred and db.get_autocommit():
            # Django's own rule for a connection that saw an error (close_if_unusable_or_obsolete)
            if db.is_usable():
                db.errors_occurred = False
            else:
                db.close()
        return OrmQ.objects.using(Conf.ORM)

    @classmethod
    def ring_at(cls, when: datetime, list_key: str | None = None) -> DoorbellBroker:
        broker = cls(list_key=list_key or Conf.CLUSTER_NAME)
        broker.not_before = when
        return broker

    def enqueue(self, task: str) -> int:
        package = self.get_connection().create(
            key=self.list_key or Conf.CLUSTER_NAME,
            payload=task,
            lock=self.not_before or timezone.now(),
        )
        return package.pk

    def dequeue(self) -> list[tuple[int, str]] | None:
        self.get_connection()
        db = connections[Conf.ORM]
        table = OrmQ._meta.db_table
        lock = OrmQ._meta.get_field("lock")
        skip = " FOR UPDATE SKIP LOCKED" if db.features.has_select_for_update_skip_locked else ""
        # the primary key is the order of enqueueing; `lock` is "nobody pulls this before"
        sql = (
            f"UPDATE {table} SET lock = %s WHERE id IN (SELECT id FROM {table} "
            f"WHERE key = %s AND lock < %s ORDER BY id LIMIT %s{skip}) RETURNING id, payload"
        )
        now = timezone.now()
        params = [
            lock.get_db_prep_value(self.timeout(None), db),
            self.list_key,
            lock.get_db_prep_value(now, db),
            Conf.BULK,
        ]
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            taken = sorted(cursor.fetchall())
        if taken:
            return taken
        time.sleep(Conf.POLL)  # an empty queue: spare the database, as q2 does
        return None
