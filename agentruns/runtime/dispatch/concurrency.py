"""Concurrency keys: at most `limit` runs of an agent sharing a key hold it at once (issue 30).

An agent declares a key from its input (`register_agent(agent, concurrency_key=lambda input:
input["order_id"], concurrency=1)`). A run that finds its key full at start is queued but not
admitted: `waiting_behind` names the run ahead of it in the key's line, `enqueued_at` is NULL,
and every claim skips it (`claims.claim_queued`, `RunStore.claim`, the sweeper and the lease
keeper's hand-back all ask for `waiting_behind IS NULL`), so claiming stays one statement and a
run without a key pays nothing. A run holds its key (`holds_key`) from its admission until it
ends (succeeded, failed, cancelled); a crash changes nothing (the row says it holds, whoever
re-lets the lease); a run parked for a person keeps its place unless its agent declares
`release_while_waiting=True`. A retry, a resumed run that had let its place go, and a fork take
the key again.

Every admission is decided under the key's row lock (`ConcurrencyKey`, FOR UPDATE) in the
transaction of the change that asks for it: the start that creates the run, or the status change
that ends (or parks) a holder, which admits the next runs of the line in start order in the same
transaction and rings them (a NOTIFY to the claimers on PostgreSQL, a q2 doorbell otherwise).
The line is `(created_at, id)` order; each run in it waits behind the one before it, the first
behind the oldest holder. Lock order: the key's row before any run row of the line (a cancel
locks the key first: `lock_key_of`); a holder's own row and a retried run's are never touched by
another key holder, so those callers may hold them already. SQLite serialises writers, so the
same statements are as safe there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from agentruns.models import TERMINAL_RUN_STATUSES, ConcurrencyKey, Run, RunStatus
from agentruns.registry.run_input.concurrency import concurrency_of
from agentruns.runtime import writer
from agentruns.runtime.dispatch import claims
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.events import EventSpec, EventType
from agentruns.runtime.store.sql import run_value

KEY_MAX = Run._meta.get_field("concurrency_key").max_length


class BadConcurrencyKey(ValueError):
    """The agent's key function failed on this input, or gave a key no column can hold."""


def key_for(agent: str, run_input: Any) -> str | None:
    """The concurrency key of `run_input` by the agent's declaration (None: no key, or the function
    answered None); a ValueError naming the problem when it cannot give one."""
    declared = concurrency_of(agent)
    if declared is None:
        return None
    try:
        value = declared.key(run_input)
    except Exception as exc:  # the input lacks what the key is made of: the caller's 400
        raise BadConcurrencyKey(f"concurrency key: {type(exc).__name__}: {exc}") from None
    if value is None:
        return None
    key = str(value)
    if not key or len(key) > KEY_MAX or not key.isprintable():
        raise BadConcurrencyKey(f"concurrency key: must be 1 to {KEY_MAX} printable characters")
    return key


def short(run_id: uuid.UUID | str) -> str:
    return str(run_id)[:8]


@dataclass
class _Member:
    id: uuid.UUID
    holds: bool
    behind: uuid.UUID | None


def declared_limit(agent: str) -> int | None:
    """The agent's limit as this process's code declares it (None: the agent is not deployed
    here, or declares no key)."""
    declared = concurrency_of(agent)
    return declared.limit if declared is not None else None


# constant statements (the ORM compiled the line's query anew per call: ~3 ms of CPU, measured)
_RUNS, _KEYS = Run._meta.db_table, ConcurrencyKey._meta.db_table
_LIMIT = '"limit"'  # a reserved word, quoted alike by PostgreSQL and SQLite
LOCK_SQL = f"SELECT {_LIMIT} FROM {_KEYS} WHERE agent = %s AND key = %s FOR UPDATE"
UPSERT_SQL = (
    f"INSERT INTO {_KEYS} (agent, key, {_LIMIT}) VALUES (%s, %s, %s) "
    f"ON CONFLICT (agent, key) DO UPDATE SET {_LIMIT} = EXCLUDED.{_LIMIT} RETURNING {_LIMIT}"
)
DROP_SQL = f"DELETE FROM {_KEYS} WHERE agent = %s AND key = %s"
# the rows of the partial index `run_key_line_idx` of one key, in start order
LINE_SQL = (
    f"SELECT id, holds_key, waiting_behind FROM {_RUNS} "
    "WHERE (holds_key OR waiting_behind IS NOT NULL) AND agent = %s AND concurrency_key = %s "
    "ORDER BY created_at, id"
)
KEY_OF_SQL = f"SELECT agent, concurrency_key FROM {_RUNS} WHERE id = %s"
LEAVES_SQL = f"UPDATE {_RUNS} SET holds_key = %s, waiting_behind = NULL WHERE id = %s"
# back in its line (a retry, a resume): pointing at itself until the plan places or admits it
REJOINS_SQL = f"UPDATE {_RUNS} SET holds_key = %s, waiting_behind = id WHERE id = %s"
_PK = Run._meta.pk


def _rows(sql: str, params: list[Any]) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def _run_param(run_id: uuid.UUID | str) -> Any:
    return run_value("id", uuid.UUID(str(run_id)))


def _lock(agent: str, key: str, limit: int | None, *, create: bool = False) -> int:
    """Lock the key's row and return its limit. `limit`: the agent's declaration in this
    process, stored when it differs (None: keep the stored one); `create`: a start, which
    usually makes the row, so it upserts at once. A row that is gone, with no declaration here,
    is made with limit 1."""
    if not (create and limit is not None):
        sql = LOCK_SQL if connection.vendor != "sqlite" else LOCK_SQL.removesuffix(" FOR UPDATE")
        found = _rows(sql, [agent, key])  # SQLite: one writer at a time, no row locks needed
        if found and (limit is None or int(found[0][0]) == limit):
            return max(1, int(found[0][0]))
    # an upsert takes the row lock whether it inserts or updates (a concurrent start waits here)
    (stored,) = _rows(UPSERT_SQL, [agent, key, limit or 1])[0]
    return max(1, int(stored))


def _line(agent: str, key: str) -> list[_Member]:
    """The runs holding the key and those waiting for it, in start order."""
    return [
        _Member(_PK.to_python(i), bool(holds), _PK.to_python(behind) if behind else None)
        for i, holds, behind in _rows(LINE_SQL, [agent, key])
    ]


@dataclass
class _Plan:
    admitted: list[_Member]
    waiting: list[tuple[_Member, uuid.UUID]]  # (run, the run it now waits behind)


def _plan(line: list[_Member], limit: int) -> _Plan:
    holders = [m for m in line if m.holds]
    queue = [m for m in line if not m.holds]
    free = max(0, limit - len(holders))
    admitted, rest = queue[:free], queue[free:]
    ahead = [m.id for m in line if m.holds or m in admitted]
    waiting = []
    for i, member in enumerate(rest):
        waiting.append((member, rest[i - 1].id if i else ahead[0]))
    return _Plan(admitted, waiting)


def _admitted_event(key: str, why: str) -> EventSpec:
    return (EventType.RUN_STATUS, {"status": RunStatus.QUEUED, "reason": why, "key": key})


def _waiting_event(agent: str, key: str, behind: uuid.UUID, limit: int) -> EventSpec:
    at_once = "one run at a time" if limit == 1 else f"at most {limit} runs at once"
    return (
        EventType.RUN_STATUS,
        {
            "status": RunStatus.QUEUED,
            "reason": (
                f"waiting behind run {short(behind)}: concurrency key {key} of {agent} "
                f"takes {at_once}"
            ),
            "waiting_behind": str(behind),
            "key": key,
        },
    )


def _carry_out(agent: str, key: str, limit: int, plan: _Plan, now: datetime, *, why: str) -> None:
    """Write the plan for the runs already stored: admissions (rung) and changed places."""
    admitted = [m.id for m in plan.admitted]
    for run_id in admitted:
        writer.append(
            run_id,
            [_admitted_event(key, why)],
            set_fields={"holds_key": True, "waiting_behind": None, "enqueued_at": now},
        )
    for member, behind in plan.waiting:
        if member.behind != behind:
            writer.append(
                member.id,
                [_waiting_event(agent, key, behind, limit)],
                set_fields={"holds_key": False, "waiting_behind": behind, "enqueued_at": None},
            )
    if admitted:
        _ring(admitted)


def ring(run_ids: list[uuid.UUID]) -> None:
    """Runs queued again by somebody else's transaction (timers that came due) are due now."""
    _ring(run_ids)


def _ring(run_ids: list[uuid.UUID]) -> None:
    """Admitted runs are due now: the claimers hear it on commit (PostgreSQL), or a q2 doorbell
    per run rings in this transaction (SQLite, claims off)."""
    if claims.starts_by_notify():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [claims.CHANNEL])
        return
    for run_id in run_ids:
        enqueue(run_id)


def admit_new(run: Run, limit: int | None, now: datetime) -> list[EventSpec]:
    """A new run of a key (a start, a fork), before its row is written, inside the caller's
    transaction: admitted (`holds_key`) or placed at the end of the key's line (`waiting_behind`,
    no `enqueued_at`). `limit`: the agent's declaration here (None: the stored one). Returns the
    events that say so, for the run's first commit."""
    agent, key = run.agent, run.concurrency_key or ""
    limit = _lock(agent, key, limit, create=True)
    # its place in the line is the order starts took the lock in: stamped now, under it
    run.created_at = timezone.now()
    line = _line(agent, key)
    newcomer = _Member(run.id, False, None)
    plan = _plan([*line, newcomer], limit)
    # a limit raised by a deploy admits the runs ahead of this one as well
    others = _Plan([m for m in plan.admitted if m is not newcomer], plan.waiting[:-1])
    _carry_out(agent, key, limit, others, now, why=f"admitted: concurrency key {key} has room")
    if newcomer in plan.admitted:
        run.holds_key, run.waiting_behind = True, None
        return []
    behind = plan.waiting[-1][1]
    run.holds_key, run.waiting_behind, run.enqueued_at = False, behind, None
    return [_waiting_event(agent, key, behind, limit)]


def lock_key_of(run_id: uuid.UUID | str) -> None:
    """Lock the key of `run_id` (if it has one) before its row: what a caller that will lock the
    run and then change its place (a cancel) does first, in the lock order of the module."""
    found = _rows(KEY_OF_SQL, [_run_param(run_id)])
    if found and found[0][1] is not None:
        _lock(found[0][0], found[0][1], None)


def _ends_place(agent: str | None, status: str) -> bool:
    """A change to `status` ends the run's place: it ended, or it parked and its agent lets the
    place go while it waits."""
    if status in TERMINAL_RUN_STATUSES:
        return True
    declared = concurrency_of(agent) if agent is not None and status == RunStatus.WAITING else None
    return declared is not None and declared.release_while_waiting


_NOTHING = nullcontext()


def following(
    run_id: uuid.UUID, status: str | None, key: tuple[str, str | None] | None
) -> AbstractContextManager[None]:
    """Around the executor's commit of a change to `status`: for a run with a concurrency key
    whose place that change ends, a transaction in which `follow` lets the key go. Any other
    commit (most are: no status, or a run without a key) gets no transaction and no query."""
    if status is None or (key is not None and key[1] is None):
        return _NOTHING
    if not _ends_place(key[0] if key is not None else None, status):
        return _NOTHING  # running, or queued again by the executor (a yield): it keeps its place
    return _follow_around(run_id, status, key)


@contextmanager
def _follow_around(
    run_id: uuid.UUID, status: str, key: tuple[str, str | None] | None
) -> Iterator[None]:
    with transaction.atomic(savepoint=False):
        follow(run_id, status, key=key)
        yield


def follow(
    run_id: uuid.UUID | str, status: str | None, *, key: tuple[str, str | None] | None = None
) -> None:
    """What a change of the run's status to `status` does to its key, inside the transaction
    that writes the change: an end (and a park, when the agent lets the place go) releases it
    and admits the next runs in line; queued again after it had let it go (a retry, a resume)
    takes it again. `key`: the run's (agent, concurrency key) when the caller has it (None:
    read here)."""
    if status is None or status == RunStatus.RUNNING:
        return
    if key is None:
        found = _rows(KEY_OF_SQL, [_run_param(run_id)])
        if not found:
            return
        key = found[0]
    agent, concurrency_key = key
    if concurrency_key is None:
        return
    ends = _ends_place(agent, status)
    if not ends and status != RunStatus.QUEUED:
        return  # parked, keeping its place
    run_id = uuid.UUID(str(run_id))
    limit = _lock(agent, concurrency_key, declared_limit(agent))
    line = _line(agent, concurrency_key)
    me = next((m for m in line if m.id == run_id), None)
    if ends:
        if me is None:
            return  # it held no place (it let it go while waiting)
        _rows(LEAVES_SQL, [False, _run_param(run_id)])
        line.remove(me)
        why = f"admitted: run {short(run_id)} let concurrency key {concurrency_key} go"
    else:
        if me is not None:
            return  # holding (a yield, a backoff) or already in line
        # queued again (a retry, a resume after letting its place go): back in the line at its
        # start order; it waits behind itself until the plan writes its place (or admits it)
        _rows(REJOINS_SQL, [False, _run_param(run_id)])
        line = _line(agent, concurrency_key)
        why = f"admitted: concurrency key {concurrency_key} has room"
    if not line:
        _rows(DROP_SQL, [agent, concurrency_key])
        return
    _carry_out(agent, concurrency_key, limit, _plan(line, limit), timezone.now(), why=why)
