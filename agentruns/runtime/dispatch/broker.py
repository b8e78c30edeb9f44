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
- `take(limit, func)`: a worker process with free slots takes the doorbells waiting behind the
  one q2 gave it, in one statement (`pool.RunPool.take_waiting`); on a loaded machine q2's one
  pusher process, a task at a time, delivered a burst of 200 doorbells at ~50/s;
- on PostgreSQL a doorbell also NOTIFYs (delivered when the ringing transaction commits), and
  q2's pusher waits for that instead of sleeping `Q_POLL` on an empty queue: a run starts within
  milliseconds of its commit, and the idle poll stays as slow as `Q_POLL` says;
- a database outage is weather for the pusher and the monitor too (`dequeue`, `acknowledge`):
  they back off instead of q2's exit-and-respawn, which kept doorbells waiting 10 s after the
  database was back;
- `ring_at(when)` gives a broker whose tasks become visible only at `when`: the ORM broker's
  `lock` column ("nobody may pull this before") is the delay. A run waiting for a retry backoff
  holds no thread: it is re-queued with such a doorbell (`queue.enqueue(not_before=...)`).

Imported by q2 (by its dotted path) and by `queue.enqueue`, never at module level of the
runtime: q2 reads its settings on import.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from agentruns.runtime.dispatch.connections import close_listener, open_listener
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error

logger = logging.getLogger(__name__)


CHANNEL = "agentruns_doorbell"


class DoorbellBroker(ORM):
    not_before: datetime | None = None
    # the pusher's tries while the database is away: capped at 1 s, so runs move again within
    # about a second of its return
    _outage_backoff = weather.Backoff(base=0.1, cap=1.0)
    _listener: Any = None  # the pusher's LISTEN connection (outside the pool: it never returns)

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
        db = connections[Conf.ORM]
        if db.vendor == "postgresql" and self.not_before is None:
            with db.cursor() as cursor:  # in the caller's transaction: sent when it commits
                cursor.execute(f"NOTIFY {CHANNEL}")
        return package.pk

    def dequeue(self) -> list[tuple[int, str]] | None:
        try:
            taken = self._lock_oldest(Conf.BULK)
        except Exception as exc:
            if not is_infrastructure_error(exc):
                raise
            # q2's pusher would log a traceback, sleep 10 s and exit on any error (its sentinel
            # respawns it): runs would wait that long after the database is back. Ride it out.
            weather.database.noticed(exc, "the doorbell pusher")
            connections[Conf.ORM].close()
            time.sleep(self._outage_backoff.next())
            return None
        self._outage_backoff.reset()
        weather.database.passed()
        if taken:
            return taken
        self._wait_for_doorbell(Conf.POLL)  # an empty queue: spare the database, as q2 does
        return None

    def _wait_for_doorbell(self, timeout: float) -> None:
        """Until a NOTIFY (PostgreSQL) or `timeout`; a broken listener falls back to sleeping
        (and is opened again on the next wait)."""
        if connections[Conf.ORM].vendor != "postgresql":
            time.sleep(timeout)
            return
        try:
            listener = type(self)._listener
            if listener is None or listener.closed:
                listener = type(self)._listener = self._listen()
            for _ in listener.notifies(timeout=timeout, stop_after=1):
                pass
        except Exception as exc:
            if is_infrastructure_error(exc):
                # a restart dropped it (found only now, after the queue already answered): the
                # outage is the dequeue's to report; listen again on the next wait
                logger.info("doorbell listener lost (%s); listening again", exc)
            else:
                logger.warning("doorbell listener failed; polling", exc_info=True)
            self.stop_listening()
            time.sleep(timeout)

    def acknowledge(self, task_id: int) -> None:
        """q2's monitor acknowledges a finished doorbell. While the database is away that would
        kill the monitor (q2 catches nothing there): the doorbell stays and comes back after
        `retry`, where the run's lease makes it a no-op."""
        try:
            super().acknowledge(task_id)
            weather.database.passed()
        except Exception as exc:
            if not is_infrastructure_error(exc):
                raise
            weather.database.noticed(exc, "the q2 monitor")
            connections[Conf.ORM].close()

    @classmethod
    def stop_listening(cls) -> None:
        listener, cls._listener = cls._listener, None
        close_listener(listener)

    @staticmethod
    def _listen() -> Any:
        return open_listener(CHANNEL, Conf.ORM)

    def take(self, limit: int, func: str) -> list[tuple[int, tuple]]:
        """Up to `limit` of the oldest due tasks, locked as q2's dequeue locks them; those that
        call `func` are returned as (ack id, args), any other goes straight back to the queue."""
        taken = self._lock_oldest(limit)
        ours, others = [], []
        for ack_id, payload in taken:
            try:
                task = SignedPackage.loads(payload)
            except Exception:  # q2's pusher decides what to do with a bad package
                others.append(ack_id)
                continue
            if task.get("func") == func and task.get("args"):
                ours.append((ack_id, tuple(task["args"])))
            else:
                others.append(ack_id)
        if others:
            self.get_connection().filter(id__in=others).update(lock=timezone.now())
        return ours

    def acknowledge_all(self, ack_ids: list[int]) -> None:
        if ack_ids:
            self.get_connection().filter(id__in=ack_ids).delete()

    def _lock_oldest(self, limit: int) -> list[tuple[int, str]]:
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
        params = [
            lock.get_db_prep_value(self.timeout(None), db),
            self.list_key,
            lock.get_db_prep_value(timezone.now(), db),
            limit,
        ]
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return sorted(cursor.fetchall())
