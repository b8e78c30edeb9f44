"""Per-user quotas: token buckets for starting runs, for decisions, for hook resolutions (per
sender and per web process), thread posts and stops, and a cap on runs in flight.

A bucket holds up to `burst` tokens and refills at `per_second`; each start (or decision) takes
one. The bucket is a row (`QuotaBucket`) that every web process shares, and one check is one
statement: an UPSERT that refills by the time since the last check (the database's clock, so
hosts with skewed clocks agree), takes a token when there is one, and returns what it decided.
Concurrent checks of one user queue on that row's lock, so a burst of N from any number of
processes grants exactly the tokens there are. A refusal is `QuotaExceeded` (HTTP 429 with
`Retry-After`: the API's endpoint and the pages' middleware answer it).

The cap on runs in flight (`AGENTRUNS_RUNS_IN_FLIGHT_PER_USER`) is checked by the statement that
inserts the run, under a lock per user (`take_start`, `RunStore.create_run`).

`user=None` (trusted in-process callers: scripts, benchmarks, crashlab) and anonymous users are
not metered, except at the hooks' door, where no user is the signed sender; a burst or rate of
0 turns that bucket off. Every door that acts counts a request before it decides anything, so
refused requests (a guessed hook token, a post refused with 409, a stop refused with 403) cost
as much as granted ones. A web process's own bucket (the hooks' door) is a row keyed by the
process (host and pid).
"""

from __future__ import annotations

import math
from typing import Any

from django.db import connection

from agentruns.conf import conf
from agentruns.models import QuotaBucket
from agentruns.runtime.store.base import InFlightCap, InFlightCapReached
from agentruns.runtime.store.pg_function import IN_FLIGHT_LOCK
from agentruns.runtime.store.sql import in_flight_count_sql
from agentruns.runtime.values.ids import worker_name

IN_FLIGHT_RETRY_SECONDS = 5  # a run in flight takes seconds to finish: try again after that


class QuotaExceeded(Exception):
    """Too many requests of one kind by one user; `retry_after`: whole seconds until one more
    would pass."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = max(1, int(retry_after))


_TABLE = QuotaBucket._meta.db_table


def db_clock_sql() -> str:
    """The database's clock in unix seconds, as SQL: one value for the whole statement."""
    if connection.vendor == "postgresql":
        # one value for the whole statement (clock_timestamp() would move between its uses)
        return "extract(epoch from statement_timestamp())::float8"
    return "((julianday('now') - 2440587.5) * 86400.0)"  # SQLite: unix seconds, ms resolution


def least_greatest_sql() -> tuple[str, str]:
    """The SQL functions of the smaller and the larger of their arguments."""
    return ("LEAST", "GREATEST") if connection.vendor == "postgresql" else ("MIN", "MAX")


def take(key: str, *, burst: float, per_second: float) -> float:
    """Take one token from bucket `key`: 0.0 when granted, else the seconds until one is there.
    One statement (an UPSERT ... RETURNING), whichever backend."""
    now = db_clock_sql()
    least, greatest = least_greatest_sql()
    # the tokens the row holds now: what it had plus the refill since its stamp, up to burst
    refilled = (
        f"{least}(%s, {_TABLE}.tokens + "
        f"(CASE WHEN {now} > {_TABLE}.stamp THEN {now} - {_TABLE}.stamp ELSE 0 END) * %s)"
    )
    sql = (
        f'INSERT INTO {_TABLE} ("key", tokens, stamp, granted)'
        f" VALUES (%s, %s, {now}, %s) "
        f'ON CONFLICT ("key") DO'
        f" UPDATE SET "
        f"tokens = CASE WHEN {refilled} >= 1 THEN {refilled} - 1 ELSE {refilled} END, "
        f"granted = ({refilled} >= 1), "
        # a statement that waited for the row lock may have started before the last one
        f"stamp = {greatest}({_TABLE}.stamp, {now}) "
        f"RETURNING tokens, granted"
    )
    params = [key, burst - 1, True, *([burst, per_second] * 4)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        tokens, granted = cursor.fetchone()
    if granted:
        return 0.0
    return (1 - float(tokens)) / per_second


def _metered(user: Any) -> bool:
    return user is not None and getattr(user, "is_authenticated", False)


def _check_bucket(kind: str, what: str, user: Any, burst: float, per_second: float) -> None:
    if not _metered(user):
        return
    _check_key(f"{kind}:{user.pk}", f"too many {what}", burst, per_second)


def _check_key(key: str, refusal: str, burst: float, per_second: float) -> None:
    """A token of bucket `key`, or QuotaExceeded saying `refusal` and when to try again."""
    if burst <= 0 or per_second <= 0:
        return
    wait = take(key, burst=burst, per_second=per_second)
    if wait > 0:
        raise QuotaExceeded(
            f"{refusal}: at most {burst:g} at once, then {per_second:g} a second; "
            f"try again in {math.ceil(wait)} s",
            math.ceil(wait),
        )


def check_bucket(kind: str, what: str, user: Any, *, burst: float, per_second: float) -> None:
    """A token of `user`'s bucket `kind` (an app's own door: the desk's tickets), or
    QuotaExceeded naming `what` was refused and when to try again."""
    _check_bucket(kind, what, user, burst, per_second)


def runs_in_flight(user_id: Any, cap: int) -> int:
    """How many of the user's runs are queued or running, counting to `cap` at most (SQL of its
    own: the ORM's count built its query in 1.0 ms of CPU per start, the statement takes 0.2)."""
    with connection.cursor() as cursor:
        cursor.execute(in_flight_count_sql(), [user_id, cap])
        return int(cursor.fetchone()[0])


def _in_flight_refusal(cap: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"too many runs in flight: you have {cap} queued or running; "
        "start more when some have finished",
        IN_FLIGHT_RETRY_SECONDS,
    )


def take_start(user: Any) -> InFlightCap | None:
    """A run start by `user` (`services.start_run`): a token of the start bucket now, and the
    in-flight cap for the insert to check (`RunStore.create_run`), which makes the cap exact
    however many starts race: a count here and an insert later let 10 of 60 concurrent starts
    through a cap of 5. When the insert refuses, `refused_in_flight` gives the token back."""
    if not _metered(user):
        return None
    _check_bucket("start", "runs started", user, conf.START_BURST, conf.START_PER_SECOND)
    cap = conf.RUNS_IN_FLIGHT_PER_USER
    return InFlightCap(user.pk, cap) if cap > 0 else None


def refused_in_flight(user: Any, cap: InFlightCap) -> QuotaExceeded:
    """The insert found `cap` reached: the start's token goes back to the bucket (a refused start
    costs none, as before the cap moved into the insert); the error to raise."""
    if conf.START_BURST > 0 and conf.START_PER_SECOND > 0:
        give_back(f"start:{user.pk}", burst=conf.START_BURST)
    return _in_flight_refusal(cap.limit)


def give_back(key: str, *, burst: float) -> None:
    """One token back into bucket `key`, up to `burst` (a take whose action was refused)."""
    least, _ = least_greatest_sql()
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE {_TABLE} SET tokens = {least}(%s, tokens + 1) WHERE "key" = %s', [burst, key]
        )


def hold_in_flight(cap: InFlightCap | None) -> None:
    """A start that inserts its run by itself (`services.fork_run`), right after that insert and
    inside its transaction: the same per-user lock as `create_run`'s (PostgreSQL: the advisory
    lock; SQLite: the insert already holds the write lock), then the count, which includes the
    run just inserted and every start that held the lock before: over the cap it raises
    InFlightCapReached and the caller's transaction rolls the insert back."""
    if cap is None:
        return
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s || %s, 0))",
                [IN_FLIGHT_LOCK, str(cap.user_id)],
            )
        cursor.execute(in_flight_count_sql(), [cap.user_id, cap.limit + 1])
        if int(cursor.fetchone()[0]) > cap.limit:
            raise InFlightCapReached(str(cap.user_id))


def check_decision(user: Any) -> None:
    """One decision (approve, reject, reconcile; each item of a bulk decision) by `user`."""
    _check_bucket("decide", "decisions", user, conf.DECISION_BURST, conf.DECISION_PER_SECOND)


# a Standard Webhooks sender has no user: the holder of AGENTRUNS_HOOK_SECRET is one sender
SIGNED_HOOK_SENDER = "signed"


def check_hook(user: Any) -> None:
    """One `POST /api/hooks/<token>`, before its token is looked at (a guess that finds no run
    costs as much as a resolution): a token of its sender's bucket (a user's, or the signed
    sender's when `user` is None), then one of this web process's, which every sender shares."""
    sender = user.pk if _metered(user) else SIGNED_HOOK_SENDER
    _check_key(f"hook:{sender}", "too many hook resolutions", conf.HOOK_BURST, conf.HOOK_PER_SECOND)
    _check_key(
        f"hook-process:{worker_name()}"[:100],  # (QuotaBucket.key's length)
        "this server takes no more hook resolutions now",
        conf.HOOK_PROCESS_BURST,
        conf.HOOK_PROCESS_PER_SECOND,
    )


def check_post(user: Any) -> None:
    """One message posted to a thread by `user` (a post that is refused counts too)."""
    _check_bucket("post", "thread posts", user, conf.ACTION_BURST, conf.ACTION_PER_SECOND)


def check_stop(user: Any) -> None:
    """One stop of a run asked by `user`, before whether they may is checked (a refused one
    counts too)."""
    _check_bucket("stop", "stops", user, conf.ACTION_BURST, conf.ACTION_PER_SECOND)
