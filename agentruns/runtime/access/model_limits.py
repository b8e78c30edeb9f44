"""The model providers' rate limits, kept before each request (AGENTRUNS_MODEL_LIMITS).

A provider limits requests and tokens a minute per model, and enforces the minute over shorter
windows too (60 a minute may mean 1 a second), answering 429 beyond it. The engine keeps to the
limit in advance, across every worker process: each model request first reserves a slot in one
shared bucket per model name (`ModelRateBucket`), ONE statement (an UPSERT ... RETURNING on the
database's clock, as the per-user quotas do, `quotas.py`; PostgreSQL and SQLite). Slots are
spread evenly: consecutive requests are `request_interval(rpm)` apart, so any second holds at
most ceil(rpm / 60) of them and any minute at most rpm, even when a request reaches the
provider up to AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS (0.25) after its slot: the provider counts
arrivals on its own clock, and slots exactly a second apart would put a third request into one
of its seconds whenever the first of them arrived a few milliseconds late. (The price: a limit
of a whole number a second is kept at 1 / (1 + jitter) of it, 120 a minute at 96.) Tokens are
charged to the same slot: a request may not go before the tokens of the previous ones have
accrued at tpm / 60 a second.

What makes a request late: under load, building it and handing it to the process's stream loop
took 10-120 ms (and 0.1-0.4 s for a process's first, which builds the client: `prepare()` does
that before the slot is reserved). A provider whose client waits for the slot at the wire
(`precise_start`: the OpenAI-compatible one) is therefore handed the request `HANDOFF_SECONDS`
early and holds it until the slot; one it finds later than half the jitter allowance after its
slot (a process too busy to wake it on time) it does not send, and the run backs off and
reserves a new slot; what is left is the network and the provider's own clock.

The tokens a request is charged (`request_tokens`): the prompt as JSON at 4 characters a token
(the conversation and the tool declarations; JSON's quotes and braces make it a slight
over-count), plus the answer's `max_tokens` when the agent's model settings or
OPENAI_REQUEST_OPTIONS set one (what the answer may use at most, which is what providers count
when they admit a request); without one, the tokens the run's previous answer reported are
charged with its next request. So the charge needs no second statement after the answer; the
run's last answer is the one never charged.

A run whose slot is a moment away waits on its thread; a run whose slot is further off backs off
without a thread (`RunExecutor.back_off`: queued, its doorbell due `wake_lead()` before the
slot, "waiting on the model's rate limit" in its `error`, on its page and in its status event,
which carries the slot). Woken, its executor finds the slot in that event and sleeps on its thread
until the slot, so the request leaves on time whatever the wake-up's delay; a run woken after
its slot (a worker far too busy) reserves a new one instead: a slot is never used late. An
in-process executor (no pool to hand the run back to) waits on its thread, noticing a cancel.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple

from django.db import connection

from agentruns.conf import ModelLimit, conf
from agentruns.models import ModelRateBucket, StepKind, StepStatus
from agentruns.runtime.access.quotas import db_clock_sql, least_greatest_sql
from agentruns.runtime.outages.model_outage import ModelOutage, latest_queued_event
from agentruns.runtime.providers import ModelError
from agentruns.runtime.values.timestamps import iso

log = logging.getLogger(__name__)

# a run woken this much after the slot it backed off for reserves a new one (never sent late)
LATE_SECONDS = 0.05
# a provider that waits for the slot at the wire (`precise_start`) is handed the request this
# long before it: building it and handing it to the stream loop took 10-120 ms under load
HANDOFF_SECONDS = 0.25
# a run backing off for its slot is woken `wake_lead()` before it: the claimer's poll (the
# longest a due run waits to be claimed) plus this, for a busy worker to reload it
RELOAD_SECONDS = 1.0
KEY = "model_rate_limit"  # the backing-off event's key for the slot
WAITING = "waiting on the model's rate limit"
CHARS_PER_TOKEN = 4

_TABLE = ModelRateBucket._meta.db_table


def request_interval(rpm: int, jitter: float | None = None) -> float:
    """Seconds between two slots of a model limited to `rpm` requests a minute (0: none), so
    that no second holds more than ceil(rpm / 60) arrivals and no minute more than rpm, with
    each request arriving up to `jitter` (AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS) after its slot.
    At most one a second: 60 / rpm + jitter apart, for a provider that refills one request at a
    time (a token bucket of one) and refuses one that arrives before it is refilled."""
    if rpm <= 0:
        return 0.0
    jitter = conf.MODEL_LIMIT_JITTER_SECONDS if jitter is None else jitter
    per_second = math.ceil(rpm / 60)
    interval = max((60 + jitter) / rpm, (1 + jitter) / per_second)
    return max(interval, 60 / rpm + jitter) if per_second == 1 else interval


def token_seconds(tpm: int, tokens: int) -> float:
    """Seconds of a `tpm` tokens-a-minute budget that `tokens` use up (0: no token limit)."""
    if tpm <= 0 or tokens <= 0:
        return 0.0
    return tokens * (60 + conf.MODEL_LIMIT_JITTER_SECONDS) / tpm


class Slot(NamedTuple):
    at: float  # on the database's clock (unix seconds)
    wait: float  # seconds from the reserving statement's end until it


def _clock_sql() -> str:
    """The database's clock when the expression is evaluated. On PostgreSQL a reservation may
    wait for the model's row (hundreds of runs reserving at once), and the statement's start
    is then that wait old: a slot put there would lie in the past, and a wait measured from it
    would come back too long by the lock wait, sending the request that much after its slot
    (measured: 27 x 429 in 500 runs at 60 a minute). `clock_timestamp()` is read after the row
    lock is held, at each use: they differ by microseconds, which only widen the spacing."""
    if connection.vendor == "postgresql":
        return "extract(epoch from clock_timestamp())::float8"
    return db_clock_sql()  # SQLite: the writer's lock is taken before the statement starts


def reserve(model: str, limit: ModelLimit, tokens: int = 0) -> Slot:
    """Reserve the next slot of `model` for a request of `tokens`. One statement, whichever
    backend; concurrent callers queue on the model's row, so no two get the same slot."""
    now = _clock_sql()
    _, greatest = least_greatest_sql()
    slot = f"{greatest}({now}, {_TABLE}.next_request_at, {_TABLE}.next_token_at)"
    interval, charge = request_interval(limit.rpm), token_seconds(limit.tpm, tokens)
    sql = (
        f'INSERT INTO {_TABLE} ("model", slot, next_request_at, next_token_at)'
        f" VALUES (%s, {now}, {now} + %s, {now} + %s) "
        f'ON CONFLICT ("model") DO UPDATE SET '
        f"slot = {slot}, next_request_at = {slot} + %s, next_token_at = {slot} + %s "
        f"RETURNING slot, slot - {now}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [model, interval, charge, interval, charge])
        at, wait = cursor.fetchone()
    return Slot(float(at), max(0.0, float(wait)))


def max_tokens(model: str, agent: Any) -> int:
    """The answer's `max_tokens` as the request will carry it (0: none set)."""
    settings = getattr(agent, "model_settings", None) or {}
    value = settings.get("max_tokens") if isinstance(settings, dict) else None
    if not value and model.startswith(("openai/", "openai:")):
        from agentruns.runtime.providers.openai_compatible import request_options

        try:
            options = request_options()
        except ModelError:  # the request itself fails with the reason
            options = {}
        value = options.get("max_completion_tokens") or options.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def request_tokens(state: Any, prompt_chars: int) -> int:
    """The tokens a model request is charged (see the module docstring); `prompt_chars`: the
    request's messages and tool declarations as JSON."""
    answer = max_tokens(state.run.model or conf.MODEL, state.agent)
    if not answer:  # the previous answer's reported tokens, charged now
        answer = next(
            (
                s.completion_tokens
                for s in reversed(state.steps)
                if s.kind == StepKind.MODEL and s.status == StepStatus.SUCCEEDED
            ),
            0,
        )
    return prompt_chars // CHARS_PER_TOKEN + answer


def wake_lead() -> float:
    """How long before its slot a run that backed off for it is woken (see RELOAD_SECONDS)."""
    return conf.RUN_CLAIM_POLL_SECONDS + RELOAD_SECONDS


def describe(model: str, limit: ModelLimit) -> str:
    parts = [f"{limit.rpm} requests"] if limit.rpm else []
    parts += [f"{limit.tpm} tokens"] if limit.tpm else []
    return f"{WAITING} ({model}: {' and '.join(parts)} a minute)"


class SlotWait(NamedTuple):
    """What a request under a limit does before it goes: sleep on its thread until `due` (the
    slot; the request may be handed over `handoff` early), or back off without a thread until
    `back_off_until` with `event` (what the backing-off event carries)."""

    due: float
    back_off_until: datetime | None
    event: dict


def slot_for(state: Any, prompt_chars: Any, *, in_worker: bool) -> SlotWait | None:
    """Before a model request of the slice `state` (None: no limit on its model). The slot the
    run backed off for, if it did and it is still on time; else a new one, reserved now.
    `prompt_chars()`: the request's size, computed only when the limit counts tokens."""
    model = state.run.model or conf.MODEL
    limit = conf.MODEL_LIMITS.get(model)
    if limit is None:
        return None
    due, carried = None, {}
    if not state.slot_checked:  # the slot this run backed off for, if it did
        state.slot_checked = True
        if state.run.last_seq > 2:  # (a new run has its created and running events only)
            due, carried = _held_slot(state.run.id, model)
    if due is None:
        tokens = request_tokens(state, prompt_chars()) if limit.tpm else 0
        due = time.time() + reserve(model, limit, tokens).wait
    wait, lead = due - time.time(), wake_lead()
    if in_worker and wait > max(lead, conf.RETRY_SLEEP_MAX_SECONDS):
        held = {"model": model, "slot": iso(datetime.fromtimestamp(due, UTC))}
        event = {"waiting": describe(model, limit), **carried, KEY: held}
        return SlotWait(due, datetime.fromtimestamp(due - lead, UTC), event)
    return SlotWait(due, None, {})


def slot_start(due: float, *, precise_start: bool) -> float:
    """When a request goes for its slot at `due`: a provider that waits at the wire gets the
    request `HANDOFF_SECONDS` early (building and handing it over then cannot make it late),
    the wire holding it until `due` (`NOT_BEFORE`)."""
    return due - HANDOFF_SECONDS if precise_start else due


def _held_slot(run_id: Any, model: str) -> tuple[float | None, dict]:
    """The slot the run reserved before it backed off (None: none, or woken too late to use
    it), and the model outage that backing-off event carried (kept through this wait)."""
    latest = latest_queued_event(run_id)
    carried = {ModelOutage.KEY: latest[ModelOutage.KEY]} if ModelOutage.KEY in latest else {}
    held = latest.get(KEY)
    if not isinstance(held, dict) or held.get("model") != model:
        return None, carried
    try:
        due = datetime.fromisoformat(held["slot"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return None, carried
    late = time.time() - due
    if late > LATE_SECONDS:
        log.info("run %s: woken %.2f s after its rate-limit slot, reserves another", run_id, late)
        return None, carried
    return due, carried
