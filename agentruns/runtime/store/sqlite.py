"""The SQLite store (the `make run` default): plain statements inside `transaction.atomic()`.

SQLite serialises writers (IMMEDIATE transactions, see config/settings.py), so the run UPDATE
that allocates seqs and the event INSERT after it cannot interleave with another writer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models, transaction

from agentruns.models import Run
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.store.base import InFlightCapReached, RunStore
from agentruns.runtime.store.nudges import nudge_on_commit
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.store.sql import (
    events_insert_sql,
    in_flight_count_sql,
    insert_sql,
    run_update_sql,
    update_sql,
)


def _execute_batch(batch: WriteBatch) -> None:
    statements = []
    by_model: dict[type[models.Model], list[models.Model]] = {}
    for obj in batch.inserts:
        by_model.setdefault(type(obj), []).append(obj)
    statements += [insert_sql(objs) for objs in by_model.values()]
    statements += [update_sql(obj, fields, where) for obj, fields, where in batch.updates]
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)


def _record(
    run_id: Any,
    events: Sequence[tuple[str, dict]],
    *,
    lease_owner: str | None = None,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, Any] | None = None,
) -> tuple[int, bool]:
    sql, params = run_update_sql(
        run_id, len(events), lease_owner=lease_owner, set_fields=set_fields, incr_fields=incr_fields
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
        if row is None:
            raise (
                LeaseLost(str(run_id)) if lease_owner is not None else Run.DoesNotExist(str(run_id))
            )
        last_seq = int(row[0])
        if events:
            cursor.execute(*events_insert_sql(run_id, last_seq, events))
    if events:
        nudge_on_commit(run_id, last_seq)
    return last_seq, bool(row[1])


class SqliteStore(RunStore):
    def commit(
        self,
        run_id,
        owner,
        events,
        *,
        now,
        set_fields=None,
        incr_fields=None,
        batch=None,
        end_transaction=False,
    ) -> tuple[int, bool]:
        with transaction.atomic():
            if batch is not None:
                _execute_batch(batch)
            return _record(
                run_id, events, lease_owner=owner, set_fields=set_fields, incr_fields=incr_fields
            )

    def append(self, run_id, events, *, set_fields=None, incr_fields=None) -> int:
        last_seq, _ = _record(run_id, events, set_fields=set_fields, incr_fields=incr_fields)
        return last_seq

    def create_run(self, run, events, *, owner, now, notify=None, in_flight=None) -> int:
        if notify is not None:
            raise NotImplementedError("SQLite has no NOTIFY: its starts ring a q2 doorbell")
        run.save(force_insert=True)
        if in_flight is not None:
            # the insert holds SQLite's write lock until the caller's transaction ends, so the
            # count sees every other start (ours included) and no other start is counting now
            with connection.cursor() as cursor:
                cursor.execute(in_flight_count_sql(), [in_flight.user_id, in_flight.limit + 1])
                if cursor.fetchone()[0] > in_flight.limit:
                    raise InFlightCapReached(str(in_flight.user_id))  # the caller rolls back
        return self.append(run.id, events)
