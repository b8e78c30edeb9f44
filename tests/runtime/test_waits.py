"""Waits made by tool code and by the model (runtime/waits), in process on PostgreSQL: the run
parks holding nothing, a hook's body or the timer resumes it, the call runs again and gets what
the wait was resolved with; a token another live run holds fails at once with its id; a
timeout is an error the tool handles; due waits are fired once however many look."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from agentruns.models import Run, RunStatus, StepAttempt, StepStatus, Wait, WaitKind, WaitStatus
from agentruns.registry.waits.events import wait_timeout
from agentruns.runtime.waits.due import DueWaits, fire_due_waits
from agentruns.runtime.waits.hooks import UnknownToken, WaitAlreadyResolved, resolve_hook
from tests.helpers import advance, assert_gapless, fire_due_waits_at, steps
from tests.pydantic_ai.kit import start
from tests.runtime import wait_agents

pytestmark = pytest.mark.django_db


def _tool_step(run: Run):
    return next(s for s in steps(run) if s.kind == "tool")


def test_a_tool_waits_for_an_event_by_its_token_and_gets_the_hooks_body_once():
    wait_agents.CALLS.clear()
    run = advance(start("pa-waits", ("await_delivery", {"order_id": "O-1"})))
    assert run.status == RunStatus.WAITING, run.error
    wait = Wait.objects.get(run=run)
    assert (wait.token, wait.kind, wait.status) == ("carrier:O-1", WaitKind.EVENT, "pending")
    step = _tool_step(run)
    # parked mid-call: not an attempt (no attempt row left), the step pending, no lease held
    assert step.status == StepStatus.PENDING and step.attempts == 0
    assert not StepAttempt.objects.filter(step=step).exists()
    assert run.lease_owner == ""

    resolved = resolve_hook("carrier:O-1", {"status": "delivered"}, by="carrier")
    assert resolved.run_id == run.id
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED
    with pytest.raises(WaitAlreadyResolved) as second:
        resolve_hook("carrier:O-1", {"status": "delivered again"}, by="carrier")
    assert second.value.wait.resolved_at == Wait.objects.get(id=wait.id).resolved_at

    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = _tool_step(run)
    assert step.status == StepStatus.SUCCEEDED
    assert step.result == {"event": {"status": "delivered"}}
    assert wait_agents.CALLS["O-1"] == 2  # the call ran again from its start
    assert step.attempts == 1
    assert_gapless(run)


def test_unknown_tokens_and_other_kinds_are_not_a_hooks():
    with pytest.raises(UnknownToken):
        resolve_hook("carrier:nobody", {}, by="x")
    run = advance(start("pa-waits", ("wait_for", {"seconds": 3600})))
    timer = Wait.objects.get(run=run)
    with pytest.raises(UnknownToken):  # a timer is not resolved by a hook
        resolve_hook(timer.token, {}, by="x")


def test_a_second_run_waiting_on_a_held_token_fails_at_once_with_the_holders_id():
    holder = advance(start("pa-waits", ("await_delivery", {"order_id": "O-2"})))
    assert holder.status == RunStatus.WAITING
    second = advance(start("pa-waits", ("await_delivery", {"order_id": "O-2"})))
    assert second.status == RunStatus.SUCCEEDED, second.error
    assert _tool_step(second).result == {"held_by": str(holder.id)}
    failed = Wait.objects.get(run=second)
    assert failed.status == WaitStatus.FAILED and failed.payload == {"held_by": str(holder.id)}
    # the holder still waits and gets the event
    resolve_hook("carrier:O-2", {"n": 1}, by="carrier")
    assert advance(holder).status == RunStatus.SUCCEEDED


def test_a_token_is_free_again_once_its_holder_ended_or_was_resolved():
    first = advance(start("pa-waits", ("await_delivery", {"order_id": "O-3"})))
    Run.objects.filter(id=first.id).update(status=RunStatus.CANCELLED)  # ended while waiting
    second = advance(start("pa-waits", ("await_delivery", {"order_id": "O-3"})))
    assert second.status == RunStatus.WAITING, second.error
    assert resolve_hook("carrier:O-3", {"n": 2}, by="carrier").run_id == second.id
    assert advance(second).status == RunStatus.SUCCEEDED
    third = advance(start("pa-waits", ("await_delivery", {"order_id": "O-3"})))
    assert third.status == RunStatus.WAITING  # waited on again once resolved
    assert resolve_hook("carrier:O-3", {"n": 3}, by="carrier").run_id == third.id


def test_a_timeout_resumes_the_tool_with_an_error_it_handles():
    run = advance(start("pa-waits", ("await_delivery", {"order_id": "O-4", "timeout": 30})))
    assert run.status == RunStatus.WAITING
    wait = Wait.objects.get(run=run)
    assert wait.due_at is not None
    assert fire_due_waits(timezone.now()) == 0  # not yet
    assert fire_due_waits_at(timezone.now() + timedelta(seconds=31)) == 1
    assert fire_due_waits_at(timezone.now() + timedelta(seconds=31)) == 0  # once
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _tool_step(run).result["failed"] == "EventTimedOut"
    with pytest.raises(WaitAlreadyResolved):  # a late event: 409, not a second resolution
        resolve_hook("carrier:O-4", {}, by="carrier")


def test_a_timeout_is_none_at_infinity_and_a_clear_error_past_a_year():
    assert wait_timeout(None) is None and wait_timeout(math.inf) is None
    assert wait_timeout(30) == timedelta(seconds=30)
    for bad in (math.nan, -1, 0, 1e20, 10**400, -math.inf, timedelta(days=10**6)):
        with pytest.raises(ValueError, match="timeout"):
            wait_timeout(bad)
    # in a run: the tool's mistake fails it with the reason (not an OverflowError), nothing parks
    run = advance(start("pa-waits", ("await_delivery", {"order_id": "O-big", "timeout": 1e20})))
    assert run.status == RunStatus.FAILED and "at most 366 days" in run.error, run.error
    assert not Wait.objects.filter(run=run, status=WaitStatus.PENDING).exists()


def test_the_model_sleeps_durably_and_wakes_when_due():
    run = advance(start("pa-waits", ("wait_for", {"seconds": 3600}), say="Awake:"))
    assert run.status == RunStatus.WAITING, run.error
    timer = Wait.objects.get(run=run)
    assert timer.kind == WaitKind.TIMER
    assert abs((timer.due_at - timezone.now()).total_seconds() - 3600) < 60
    assert fire_due_waits() == 0
    assert fire_due_waits_at(timer.due_at) == 1
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert "Waited 3600 s; it is now" in run.output


def test_wait_until_a_past_time_and_tool_code_naps_return_at_once():
    run = advance(start("pa-waits", ("wait_until", {"when": "2020-01-01T00:00:00Z"})))
    assert run.status == RunStatus.SUCCEEDED, run.error
    (past,) = Wait.objects.filter(run=run)  # never parked: recorded resolved at once
    assert (past.kind, past.status, past.resolved_by) == (WaitKind.TIMER, "resolved", "timer")
    bad = advance(start("pa-waits", ("wait_until", {"when": "next tuesday"})))
    assert bad.status == RunStatus.SUCCEEDED and "not an ISO 8601" in bad.output
    short = advance(start("pa-waits", ("nap", {"seconds": 0.3})))  # slept here, recorded
    assert short.status == RunStatus.SUCCEEDED, short.error
    assert Wait.objects.get(run=short).status == WaitStatus.RESOLVED


def test_a_sleep_already_due_keeps_its_place_among_the_calls_waits():
    # replayed after the event, the due sleep must find its own record, not the event's
    run = advance(start("pa-waits", ("settle_then_await", {"order_id": "O-due"})))
    assert run.status == RunStatus.WAITING, run.error
    resolve_hook("carrier:O-due", {"status": "delivered"}, by="carrier")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    result = _tool_step(run).result
    assert result["event"] == {"status": "delivered"} and "woke_at" in result["slept"]
    assert_gapless(run)

    # a sleep of nothing, then an hour: woken once, the call ends (it does not sleep again)
    run = advance(start("pa-waits", ("nap_then_sleep", {"seconds": 3600})))
    assert run.status == RunStatus.WAITING, run.error
    hour = Wait.objects.get(run=run, status=WaitStatus.PENDING)
    assert fire_due_waits_at(hour.due_at) == 1
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Wait.objects.filter(run=run).count() == 2
    result = _tool_step(run).result
    assert result["second"]["due_at"] != result["first"]["due_at"]


def test_a_claimers_look_fires_a_timer_at_its_time():
    run = advance(start("pa-waits", ("nap", {"seconds": 1.5})))
    assert run.status == RunStatus.WAITING, run.error
    due = DueWaits()
    assert due.tick() == 0  # seen ahead, not due yet
    assert 0 < due.sleep_for(5) <= 1.5
    timer = Wait.objects.get(run=run)
    fired = 0
    while fired == 0 and timezone.now() < timer.due_at + timedelta(seconds=5):
        time.sleep(due.sleep_for(1.0))  # as the sweeper's thread sleeps between looks
        fired += due.tick()
    assert fired == 1
    timer.refresh_from_db()
    assert timer.status == WaitStatus.RESOLVED
    assert 0 <= (timer.resolved_at - timer.due_at).total_seconds() < 0.5
    assert Run.objects.get(id=run.id).status == RunStatus.QUEUED
    assert due.tick() == 0  # once


@pytest.mark.django_db(transaction=True)  # another connection holds the wait's row
def test_a_timer_another_process_was_firing_when_it_died_fires_soon_after():
    run = advance(start("pa-waits", ("nap", {"seconds": 1.5})))
    timer = Wait.objects.get(run=run)
    due = DueWaits()
    assert due.tick() == 0  # seen ahead
    params = connection.get_connection_params()
    for key in ("pool", "cursor_factory", "context"):
        params.pop(key, None)
    with psycopg.connect(**params) as other:  # another cluster's fire of it, in flight
        other.execute(f"SELECT id FROM {Wait._meta.db_table} WHERE id = %s FOR UPDATE", [timer.id])
        time.sleep((timer.due_at - timezone.now()).total_seconds() + 0.01)
        assert due.tick() == 0  # due, and locked: skipped
        other.rollback()  # that process died: its transaction is gone, the wait still pending
    due.next_look = time.monotonic() + 60  # no new look: the retry alone must fire it
    time.sleep(due.sleep_for(5.0))
    assert due.tick() == 1
    timer.refresh_from_db()
    assert timer.status == WaitStatus.RESOLVED
    assert (timer.resolved_at - timer.due_at).total_seconds() < 0.5


def test_two_agents_may_both_add_the_wait_tools():
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from agentruns.registry import get_agent, register_agent, wait_tools
    from tests.pydantic_ai.agents import play

    second = Agent(
        FunctionModel(stream_function=play, model_name="waits-script"),
        name="pa-waits-too",
        toolsets=[wait_tools()],
    )
    register_agent(second)  # tool names are global; these are everybody's
    assert {"wait_for", "wait_until"} <= set(get_agent("pa-waits-too").tools)
    run = advance(start("pa-waits-too", ("wait_for", {"seconds": 600})))
    assert run.status == RunStatus.WAITING
    assert Wait.objects.get(run=run).kind == WaitKind.TIMER


def test_an_async_tool_waits_for_an_event_too():
    run = advance(start("pa-waits", ("await_pickup", {"order_id": "P-1"})))
    assert run.status == RunStatus.WAITING, run.error
    resolve_hook("pickup:P-1", {"courier": "ada"}, by="courier")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _tool_step(run).result == {"event": {"courier": "ada"}}
