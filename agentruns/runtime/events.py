"""RunEvent allocation and nudges (DESIGN.md 4.8 and 5).

`seq` comes from `Run.last_seq`, bumped by one `UPDATE ... RETURNING` inside the transaction of
the change the events describe. The UPDATE row-locks the run on PostgreSQL (SQLite serialises all
writers), so concurrent writers (two workers, a decision and the engine) queue on that row and
every committed seq is contiguous: no holes, no duplicates.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from agentruns.models import Run, RunEvent

log = logging.getLogger(__name__)

EventSpec = tuple[str, dict]

# set by the qcluster command: an in-memory channel layer cannot reach the web process from there
IN_WORKER_PROCESS = False


class LeaseLost(Exception):
    """The run's lease moved to another worker: stop without writing anything more."""


def run_group(run_id: uuid.UUID | str) -> str:
    return f"run.{uuid.UUID(str(run_id)).hex}"


INBOX_GROUP = "approvals.inbox"


def _db_value(field_name: str, value: Any) -> Any:
    field = Run._meta.get_field(field_name)
    return field.get_db_prep_save(value, connection)


def _update_sql(
    run_id: uuid.UUID,
    n_events: int,
    lease_owner: str | None,
    set_fields: dict[str, Any] | None,
    incr_fields: dict[str, int] | None,
    where: tuple[str, list[Any]] | None = None,
    default_fields: dict[str, Any] | None = None,
) -> tuple[str, list[Any]]:
    assignments = ["last_seq = last_seq + %s"]
    params: list[Any] = [n_events]
    for name, value in (set_fields or {}).items():
        assignments.append(f"{Run._meta.get_field(name).column} = %s")
        params.append(_db_value(name, value))
    for name, value in (default_fields or {}).items():  # set only where still NULL
        column = Run._meta.get_field(name).column
        assignments.append(f"{column} = COALESCE({column}, %s)")
        params.append(_db_value(name, value))
    for name, delta in (incr_fields or {}).items():
        column = Run._meta.get_field(name).column
        assignments.append(f"{column} = {column} + %s")
        params.append(delta)
    assignments.append("updated_at = %s")
    params.append(_db_value("updated_at", timezone.now()))
    condition = "id = %s"
    params.append(_db_value("id", run_id))
    if lease_owner is not None:
        condition += " AND lease_owner = %s"
        params.append(lease_owner)
    if where is not None:
        condition += f" AND ({where[0]})"
        params.extend(where[1])
    sql = (
        f"UPDATE {Run._meta.db_table} SET {', '.join(assignments)} WHERE {condition} "
        "RETURNING last_seq, cancel_requested"
    )
    return sql, params


def _missing(run_id: uuid.UUID, lease_owner: str | None) -> Exception:
    return LeaseLost(str(run_id)) if lease_owner is not None else Run.DoesNotExist(str(run_id))


def bump_run(
    run_id: uuid.UUID,
    n_events: int,
    *,
    lease_owner: str | None = None,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, int] | None = None,
) -> tuple[int, bool]:
    """One UPDATE of the run row: allocate `n_events` seqs, apply field changes.

    With `lease_owner` the update is fenced: it only applies while that worker holds the lease
    (raises LeaseLost otherwise). Returns (last allocated seq, cancel_requested).
    """
    sql, params = _update_sql(run_id, n_events, lease_owner, set_fields, incr_fields)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise _missing(run_id, lease_owner)
    return int(row[0]), bool(row[1])


def write_events(run_id: uuid.UUID, last_seq: int, events: Sequence[EventSpec]) -> None:
    """Insert events whose seqs were allocated by `bump_run` (must be in its transaction)."""
    if not events:
        return
    first = last_seq - len(events) + 1
    now = _db_value("updated_at", timezone.now())
    run_value = _db_value("id", run_id)
    rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(events))
    params: list[Any] = []
    for i, (etype, data) in enumerate(events):
        params += [run_value, first + i, etype, json.dumps(data, cls=DjangoJSONEncoder), now]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {RunEvent._meta.db_table} (run_id, seq, type, data, created_at) VALUES {rows}",
            params,
        )
    nudge_on_commit(run_id, last_seq)


def record_statement(
    run_id: uuid.UUID,
    events: Sequence[EventSpec],
    *,
    lease_owner: str | None = None,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, int] | None = None,
    where: tuple[str, list[Any]] | None = None,
    default_fields: dict[str, Any] | None = None,
) -> tuple[str, list[Any]]:
    """PostgreSQL only: the run UPDATE and the event INSERT as ONE statement (a data-modifying
    CTE). Its rows are `(seq, cancel_requested)`, none when the run (or the lease) is gone or
    `where` does not hold."""
    update, params = _update_sql(
        run_id, len(events), lease_owner, set_fields, incr_fields, where, default_fields
    )
    values = ", ".join(["(%s::int, %s::text, %s::jsonb)"] * len(events))
    for i, (etype, data) in enumerate(events):
        params += [i, etype, json.dumps(data, cls=DjangoJSONEncoder)]
    params += [_db_value("id", run_id), len(events) - 1, _db_value("updated_at", timezone.now())]
    sql = (
        f"WITH r AS ({update}), v(i, t, d) AS (VALUES {values}) "
        f"INSERT INTO {RunEvent._meta.db_table} (run_id, seq, type, data, created_at) "
        "SELECT %s, r.last_seq - %s + v.i, v.t, v.d, %s FROM r, v "
        "RETURNING seq, (SELECT cancel_requested FROM r)"
    )
    return sql, params


def recorded(run_id: uuid.UUID, rows: Sequence[tuple], lease_owner: str | None) -> tuple[int, bool]:
    """Read what `record_statement` returned: (last seq, cancel_requested)."""
    if not rows:
        raise _missing(run_id, lease_owner)
    last_seq = max(int(r[0]) for r in rows)
    nudge_on_commit(run_id, last_seq)
    return last_seq, bool(rows[0][1])


def record(
    run_id: uuid.UUID,
    events: Sequence[EventSpec],
    *,
    lease_owner: str | None = None,
    set_fields: dict[str, Any] | None = None,
    incr_fields: dict[str, int] | None = None,
) -> tuple[int, bool]:
    """`bump_run` + `write_events`; on PostgreSQL in one statement. Returns (last seq,
    cancel_requested)."""
    if connection.vendor != "postgresql" or not events:
        last_seq, cancel = bump_run(
            run_id, len(events), lease_owner=lease_owner, set_fields=set_fields, incr_fields=incr_fields
        )
        write_events(run_id, last_seq, events)
        return last_seq, cancel
    sql, params = record_statement(
        run_id, events, lease_owner=lease_owner, set_fields=set_fields, incr_fields=incr_fields
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return recorded(run_id, rows, lease_owner)


def append_events(run_id: uuid.UUID, events: Iterable[EventSpec], **run_changes: Any) -> int:
    """Append events to a run (any writer that is not the lease holder: services, sweeper).

    Must run inside `transaction.atomic()`. Returns the last seq.
    """
    last_seq, _ = record(run_id, list(events), **run_changes)
    return last_seq


def _nudges_reach_viewers() -> bool:
    # The in-memory layer only reaches consumers in this process; a worker's nudge would be lost
    # anyway, and the consumer's database poll covers it.
    return bool(settings.REDIS_URL) or not IN_WORKER_PROCESS


def _anyone_listens_here() -> bool:
    """In-memory layer: does any consumer of this process listen to any group at all?"""
    from channels.layers import get_channel_layer

    groups = getattr(get_channel_layer(), "groups", None)
    return groups is None or bool(groups)


def nudge_on_commit(run_id: uuid.UUID, seq: int, *, inbox: bool = False) -> None:
    if not _nudges_reach_viewers():
        return
    if not settings.REDIS_URL and not _anyone_listens_here():
        return  # the engine's hot path outside a web process: nobody to reach, skip the hook
    transaction.on_commit(lambda: send_nudge(run_id, seq, inbox=inbox))


_nudge_loop: Any = None  # (pid, event loop) of the background sender, see _nudge_sender_loop
_nudge_loop_lock = threading.Lock()


def _nudge_sender_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop thread per process for cross-process nudges.

    async_to_sync would build a fresh loop, and channels_redis a fresh connection, for every
    nudge (~10 ms, measured in benchmarks/stream_latency.py), on the engine's commit path.
    Keyed by pid: a forked worker process starts its own."""
    global _nudge_loop
    with _nudge_loop_lock:
        if _nudge_loop is None or _nudge_loop[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="channel-nudges", daemon=True).start()
            _nudge_loop = (os.getpid(), loop)
        return _nudge_loop[1]


async def _group_send_nudges(layer: Any, run_id: uuid.UUID | None, seq: int, inbox: bool) -> None:
    if run_id is not None:
        await layer.group_send(run_group(run_id), {"type": "run.nudge", "seq": seq})
    if inbox:
        await layer.group_send(INBOX_GROUP, {"type": "inbox.nudge"})


def _log_failed_nudge(future: concurrent.futures.Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("channel-layer nudge failed: %r", future.exception())


def send_nudge(run_id: uuid.UUID | None, seq: int = 0, *, inbox: bool = False) -> None:
    """Tell viewers "new events exist". At-most-once by design: losing one costs latency only."""
    try:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        if layer is None:
            return
        if settings.REDIS_URL:
            # cross-process layer: fire and forget on the background loop (never blocks a commit)
            future = asyncio.run_coroutine_threadsafe(
                _group_send_nudges(layer, run_id, seq, inbox), _nudge_sender_loop()
            )
            future.add_done_callback(_log_failed_nudge)
            return
        # in-memory layer: deliver on the caller's (the web server's) loop, where its consumers
        # are; a group nobody in this process listens to costs nothing (the engine's hot path)
        members = getattr(layer, "groups", None)
        sends = []
        if run_id is not None:
            sends.append((run_group(run_id), {"type": "run.nudge", "seq": seq}))
        if inbox:
            sends.append((INBOX_GROUP, {"type": "inbox.nudge"}))
        for group, message in sends:
            if members is None or members.get(group):
                async_to_sync(layer.group_send)(group, message)
    except Exception:  # a nudge must never break the write it follows
        log.warning("channel-layer nudge failed", exc_info=True)


def event_payload(event: RunEvent) -> dict:
    return {
        "seq": event.seq,
        "type": event.type,
        "data": event.data,
        "created_at": _iso(event.created_at),
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
