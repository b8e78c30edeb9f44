"""The rows of the operation keys (models/operations.py): a call takes its key, its outcome
settles it, a call that finds it held waits for it, and a lead allows one more execution.

What is guaranteed rests on the unique constraints, not on the reads here: two calls racing for
a slot both INSERT, the database keeps one (`ON CONFLICT DO NOTHING`; on PostgreSQL the second
waits for the first's transaction and then inserts nothing), and the loser reads again and finds
the key held or used. Every function runs inside the caller's transaction: the executor's
"before" commit takes a key, the commit that records the call's result settles it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agentruns.models import (
    OperationAllowance,
    OperationExecution,
    OperationState,
    Run,
    RunStatus,
    Step,
)
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.values.ids import actor_name

HELD, DONE, RELEASED = OperationState.HELD, OperationState.DONE, OperationState.RELEASED


class AllowanceRefused(Exception):
    """One more execution of the key cannot be allowed now (the reason says why): a 409."""


@dataclass(frozen=True)
class Taken:
    """The call holds the key: newly (`fresh`), or still (its own row, from before a crash or a
    retry of the same call)."""

    row: OperationExecution
    fresh: bool


@dataclass(frozen=True)
class Used:
    """Every slot of the key was executed: `row`, the latest, answers the call."""

    row: OperationExecution


@dataclass(frozen=True)
class Busy:
    """Another call holds the key (it is being made, or its outcome is unknown): `row`."""

    row: OperationExecution


def take(key: str, *, run_id: Any, step_id: Any, tool: str) -> Taken | Used | Busy:
    """Take `key` for the call of step `step_id`: its own live row if it has one, else the
    lowest free slot (1, then one per allowance), unless the key is held or every slot used.
    A first call of a key costs two statements: the read and the INSERT."""
    for _ in range(5):  # a lost race is followed by a read that sees the winner
        live = _executions('"key" = %s AND state <> %s ORDER BY slot', [key, RELEASED])
        own = next((row for row in live if row.step_id == step_id), None)
        if own is not None:
            return Taken(own, fresh=False) if own.state == HELD else Used(own)
        held = next((row for row in live if row.state == HELD), None)
        if held is not None:
            return Busy(held)
        slots = 1 + (OperationAllowance.objects.filter(key=key).count() if live else 0)
        used = {row.slot for row in live}
        free = next((slot for slot in range(1, slots + 1) if slot not in used), None)
        if free is None:
            return Used(live[-1])
        row = OperationExecution(
            key=key, slot=free, state=HELD, run_id=run_id, step_id=step_id, tool=tool
        )
        if _inserted(row):
            return Taken(row, fresh=True)
    raise RuntimeError(f"operation key {key!r}: no stable answer after five tries")


_TABLE = OperationExecution._meta.db_table
_INSERTED = ("key", "slot", "state", "run_id", "step_id", "tool", "waiters", "created_at")
_COLUMNS = ", ".join('"' + name + '"' for name in _INSERTED)  # "key" is a keyword in SQL
INSERT_SQL = (
    f"INSERT INTO {_TABLE} ({_COLUMNS}) VALUES ({', '.join(['%s'] * len(_INSERTED))}) "
    "ON CONFLICT DO NOTHING RETURNING id"
)


def _executions(where: str, params: list[Any]) -> list[OperationExecution]:
    """The rows `where` selects (and orders or locks), the statement written out: every gated
    call reads its key's rows this way, and the ORM's building of the query cost the worker
    three times the database's answer. `raw()` still converts each column as the ORM does."""
    return list(OperationExecution.objects.raw(f"SELECT * FROM {_TABLE} WHERE {where}", params))


def _inserted(row: OperationExecution) -> bool:
    """INSERT `row` unless a unique constraint already holds its slot, its key's hold or its
    step (then nothing: on PostgreSQL after the conflicting transaction ended). Sets its id."""
    row.created_at = timezone.now()
    values = [
        row._meta.get_field(name).get_db_prep_value(getattr(row, name), connection)
        for name in _INSERTED
    ]
    with connection.cursor() as cursor:
        cursor.execute(INSERT_SQL, values)
        found = cursor.fetchone()
    if found is None:
        return False
    row.id = found[0]
    return True


def settle(step_id: Any, state: str, result: Any = None) -> bool:
    """The key `step_id` holds becomes `state`: DONE with the call's `result` (what later calls
    are answered with), or RELEASED (the call did not happen; the slot is free again), in one
    statement. The runs waiting for the key are due now and rung when the caller's transaction
    commits. Whether it held one."""
    field = OperationExecution._meta.get_field
    now = timezone.now()
    params = [state, field("settled_at").get_db_prep_value(now, connection)]
    # the waiters stay listed (RETURNING gives the row as updated): nobody joins a settled key
    sets = "state = %s, settled_at = %s"
    if state == DONE:
        sets += ", result = %s"
        params.append(field("result").get_db_prep_value(result, connection))
    params += [field("step_id").get_db_prep_value(step_id, connection), HELD]
    sql = f"UPDATE {_TABLE} SET {sets} WHERE step_id = %s AND state = %s RETURNING waiters"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchone()
    if found is None:
        return False
    waiting = field("waiters").from_db_value(found[0], None, connection) or []
    if waiting:
        # a waiter backs off until its next look at the key, and a run is not claimed before
        # it is due (a doorbell finds it not due): the wait is over now
        queued = Run.objects.filter(id__in=waiting, status=RunStatus.QUEUED, enqueued_at__gt=now)
        queued.update(enqueued_at=now)
    for run_id in dict.fromkeys(waiting):
        transaction.on_commit(partial(enqueue, run_id))
    return True


def run_ended(run: Any, note: str) -> int:
    """`run` ends while a call of it holds a key (cancelled mid-retry or after its worker died,
    stopped by a deadline): nobody will settle that call, and nobody can say it did not happen,
    so the key is done with its outcome unconfirmed (later calls are told so; a lead may allow
    one more). No query for a run whose tools take no key. Returns how many keys it held.
    `run`: the run, or its id (then its snapshot is read)."""
    if not isinstance(run, Run):
        run = Run.objects.only("id", "tool_snapshot").get(id=run)
    snapshot = run.tool_snapshot or {}
    if not any(policy.get("operation_key") is not False for policy in snapshot.values()):
        return 0
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    run_id = OperationExecution._meta.get_field("run_id").get_db_prep_value(run.id, connection)
    held = _executions(f"run_id = %s AND state = %s{lock}", [run_id, HELD])
    settled = 0
    for row in held:
        settled += settle(row.step_id, DONE, {"outcome_unknown": True, "note": note})
    return settled


def wait_for(execution_id: int, run_id: Any) -> bool:
    """Put run `run_id` on the list of a held key's waiters (rung when it is settled). False when
    the key was settled meanwhile: the caller takes it again at once."""
    row = (
        OperationExecution.objects.select_for_update()
        .filter(id=execution_id, state=HELD)
        .only("id", "waiters")
        .first()
    )
    if row is None:
        return False
    if str(run_id) not in row.waiters:
        row.waiters = [*row.waiters, str(run_id)]
        row.save(update_fields=["waiters"])
    return True


def done_by_hand(key: str, *, run_id: Any, step_id: Any, tool: str, result: Any) -> bool:
    """A person says the call was made (a failed step resolved by hand): it takes the key's
    free slot, done, so later calls are answered with it. False when the key had none free (it
    was held or used meanwhile): what happened by hand happened all the same."""
    claim = take(key, run_id=run_id, step_id=step_id, tool=tool)
    return isinstance(claim, Taken) and settle(step_id, DONE, result)


@dataclass
class KeyState:
    """A key as people see it: its executions, the allowances, and what its next call meets:
    `held` (it waits), `used` (it is answered "already done") or `free` (it runs)."""

    key: str
    executions: list[OperationExecution]
    allowances: list[OperationAllowance]

    @property
    def slots(self) -> int:
        return 1 + len(self.allowances)

    @property
    def live(self) -> list[OperationExecution]:
        return [row for row in self.executions if row.state != RELEASED]

    @property
    def status(self) -> str:
        if any(row.state == HELD for row in self.live):
            return "held"
        return "used" if len(self.live) >= self.slots else "free"

    @property
    def last_done(self) -> OperationExecution | None:
        done = [row for row in self.live if row.state == DONE]
        return max(done, key=lambda row: row.slot) if done else None


def key_states(keys: list[str]) -> dict[str, KeyState]:
    """The state of each of `keys`, in two queries whatever their number; one when none of
    them was ever taken (an allowance is granted only to a key with executions, and neither
    is ever deleted), as a request's first refund is."""
    keys = list(dict.fromkeys(k for k in keys if k))
    states = {key: KeyState(key, [], []) for key in keys}
    if not keys:
        return states
    marks = ", ".join(["%s"] * len(keys))
    where = f'"key" IN ({marks}) ORDER BY "key", slot, id'
    for row in _executions(where, keys):
        states[row.key].executions.append(row)
    taken = [key for key in keys if states[key].executions]
    if taken:
        for allowance in OperationAllowance.objects.filter(key__in=taken).order_by("key", "slot"):
            states[allowance.key].allowances.append(allowance)
    return states


def key_state(key: str) -> KeyState:
    return key_states([key])[key]


def held_arguments(prefix: str, excluding: list[str]) -> list[tuple[str, Any]]:
    """(idempotency key, arguments) of each call holding a key that starts with `prefix` right
    now (being made, retried, or of unknown outcome), but the keys in `excluding`: what a tool's
    `limit=` counts as in flight. The held rows are read written out (a gated call's "before"
    commit reads them, and the ORM's building of the query cost more than the answer); their
    steps only when there are any."""
    like = connection.ops.prep_for_like_query(prefix) + "%"
    marks = ", ".join(["%s"] * len(excluding))
    others = f' AND "key" NOT IN ({marks})' if excluding else ""
    where = f"state = %s AND \"key\" LIKE %s ESCAPE '\\'{others}"
    held = _executions(where, [HELD, like, *excluding])
    if not held:
        return []
    steps = Step.objects.filter(id__in=[row.step_id for row in held])
    return list(steps.values_list("idempotency_key", "arguments"))


def allow_one_more(
    key: str, *, user: Any, reason: str, run_id: uuid.UUID | None = None
) -> OperationAllowance:
    """One more execution of `key` may run (a second partial refund): its next slot opens. Refused
    (AllowanceRefused) when the key was never used, or an allowance is still unused: each lead's
    "one more" is one execution, and two leads allowing at once allow one (the unique slot)."""
    state = key_state(key)
    if not state.live:
        raise AllowanceRefused(f"{key} has not been executed: its next call runs without allowance")
    if state.slots > len(state.live):
        unused = state.allowances[-1]
        raise AllowanceRefused(
            f"one more execution of {key} is already allowed (by {unused.granted_by_name or '?'} "
            f"at {unused.created_at.isoformat(timespec='seconds')}) and not used yet"
        )
    try:
        with transaction.atomic():
            return OperationAllowance.objects.create(
                key=key,
                slot=state.slots + 1,
                granted_by=user if getattr(user, "is_authenticated", False) else None,
                granted_by_name=actor_name(user) or "",
                reason=reason,
                run_id=run_id,
            )
    except IntegrityError:
        raise AllowanceRefused(f"someone else just allowed one more execution of {key}") from None
