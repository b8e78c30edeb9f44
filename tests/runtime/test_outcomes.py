"""A run's outcome beside its status, declared by its agent (agentruns/registry/outcomes/) and
set when the run ends (agentruns/runtime/outcomes.py), on every way a run ends: the final
answer's commit, a failed step, a cancel; a hook that fails never fails the run's end; a retry
starts without one; a hand-over tool's call makes the engine's own `handed_over` and an inbox
item. On the real engine, in-process, PostgreSQL.
"""

from __future__ import annotations

import logging

import pytest
from django.db import connection, transaction

from agentruns.models import RunStatus
from agentruns.registry import Agent, ToolContext, register_agent, tool
from agentruns.registry.outcomes import HandoverClosed
from agentruns.services import cancel_run, retry_run, start_run
from approvals import services as decisions
from approvals.models import Approval
from tests.helpers import advance, events, make_user, script_run
from tests.testkit import FAILS, script_policy


@tool(handover=True)
def o_hand_over(ctx: ToolContext, reason: str) -> dict:
    """Give the request to a person."""
    return {"handed_over": True}


HEARD: list[HandoverClosed] = []  # what `o_hand_over_heard`'s hook was told


@tool(handover=True, handover_closed=HEARD.append)
def o_hand_over_heard(ctx: ToolContext, reason: str) -> dict:
    """Give the request to a person, and hear when they close it."""
    return {"handed_over": True}


def shipped(run, steps) -> str | None:
    """The test agent's outcome hook: what its input asks for, else from its steps."""
    how = (run.input or {}).get("outcome_hook", "")
    if how == "raise":
        raise RuntimeError("the hook broke")
    if how == "bad name":
        return "Not A Name!"
    if how == "bad query":
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    echoed = any(s.tool == "t_echo" and s.status == "succeeded" for s in steps)
    return f"{run.status}_{'echoed' if echoed else 'quiet'}"


register_agent(
    Agent(
        name="outcome-hooked",
        instructions="Follow the script.",
        tools=["t_echo", "t_explode", "o_hand_over"],
        scripted_policy=script_policy,
        outcome=shipped,
        outcomes={"succeeded_echoed": "positive", "failed_quiet": "negative"},
    )
)
register_agent(
    Agent(
        name="outcome-plain",
        instructions="Follow the script.",
        tools=["t_echo", "o_hand_over"],
        scripted_policy=script_policy,
    )
)
register_agent(
    Agent(
        name="outcome-heard",
        instructions="Follow the script.",
        tools=["o_hand_over_heard"],
        scripted_policy=script_policy,
    )
)
ECHO = {"calls": [["t_echo", {"text": "hi"}]]}
HAND_OVER = {"calls": [["o_hand_over", {"reason": "not mine to do"}]]}


@pytest.mark.django_db
def test_the_agents_hook_gives_the_outcome_in_the_answers_commit():
    run = advance(script_run([ECHO, {"text": "bye"}], agent="outcome-hooked"))
    assert (run.status, run.outcome) == (RunStatus.SUCCEEDED, "succeeded_echoed")
    assert events(run, "run.status")[-1].data == {
        "status": "succeeded",
        "error": "",
        "stop_reason": "",
        "outcome": "succeeded_echoed",
    }


@pytest.mark.django_db
def test_a_failed_run_gets_its_outcome_and_a_retry_starts_without_one():
    FAILS["t_explode"] = 0
    run = advance(script_run([{"calls": [["t_explode", {}]]}], agent="outcome-hooked"))
    assert (run.status, run.outcome) == (RunStatus.FAILED, "failed_quiet")
    retried = retry_run(run.id)
    assert (retried.status, retried.outcome) == (RunStatus.QUEUED, "")


@pytest.mark.django_db
def test_a_cancelled_run_gets_its_outcome():
    run = script_run([ECHO], agent="outcome-hooked")
    cancel_run(run.id, reason="not needed")
    run.refresh_from_db()
    assert (run.status, run.outcome) == (RunStatus.CANCELLED, "cancelled_quiet")


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["raise", "bad name", "bad query"])
def test_a_hook_that_fails_never_fails_the_runs_end(how, caplog):
    caplog.set_level(logging.WARNING, logger="agentruns.runtime.outcomes")
    run = advance(
        start_run("outcome-hooked", {"script": [ECHO, {"text": "bye"}], "outcome_hook": how}).run
    )
    assert (run.status, run.outcome, run.output) == (RunStatus.SUCCEEDED, "", "bye")
    assert any(str(run.id) in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_without_a_hook_a_hand_over_is_the_engines_outcome_and_an_inbox_item():
    quiet = advance(script_run([ECHO, {"text": "bye"}], agent="outcome-plain"))
    assert (quiet.status, quiet.outcome) == (RunStatus.SUCCEEDED, "")
    assert not Approval.objects.filter(run=quiet).exists()
    handed = advance(
        script_run([HAND_OVER, {"text": "a person takes over"}], agent="outcome-plain")
    )
    assert (handed.status, handed.outcome) == (RunStatus.SUCCEEDED, "handed_over")
    item = Approval.objects.get(run=handed)
    assert (item.kind, item.status, item.tool) == ("handover", "pending", "o_hand_over")
    assert item.requested_args == {"reason": "not mine to do"}


@pytest.mark.django_db
def test_a_hook_wins_over_the_hand_over_default():
    run = advance(script_run([HAND_OVER, {"text": "over"}], agent="outcome-hooked"))
    assert run.outcome == "succeeded_quiet"  # the hook's answer
    assert Approval.objects.get(run=run).kind == "handover"  # the item opens all the same


@pytest.mark.django_db
def test_a_hand_over_tool_hears_its_close_in_the_closing_transaction(django_user_model):
    HEARD.clear()
    call = {"calls": [["o_hand_over_heard", {"reason": "not mine"}]]}
    run = advance(script_run([call, {"text": "over"}], agent="outcome-heard", ticket_id="T-9"))
    item = Approval.objects.get(run=run, kind="handover")
    person = make_user(
        django_user_model, "closer", ["approvals.view_approval", "approvals.decide_approval"]
    )
    assert HEARD == []  # opening it tells the tool nothing
    with transaction.atomic():
        decisions.close(item.id, user=person, internal_note="done by phone", reason="sorted")
        assert len(HEARD) == 1  # inside the close's transaction
    item.refresh_from_db()
    assert HEARD == [
        HandoverClosed(
            run_id=run.id,
            tool="o_hand_over_heard",
            arguments={"reason": "not mine"},
            run_input=run.input,
            closed_by=person,
            closed_at=item.decided_at,
            reason="sorted",
            internal_note="done by phone",
        )
    ]
    assert run.input["ticket_id"] == "T-9"


def test_declarations_are_checked_when_the_agent_registers():
    base = {"name": "outcome-bad", "instructions": "x", "scripted_policy": script_policy}
    with pytest.raises(ValueError, match="tone"):
        register_agent(Agent(**base, outcomes={"fine": "green"}))
    with pytest.raises(ValueError, match="outcome is a name"):
        register_agent(Agent(**base, outcomes={"Not Fine": "positive"}))
    with pytest.raises(ValueError, match="function of"):
        register_agent(Agent(**base, outcome="refunded"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="currency_arg"):
        tool(name="o_bad_currency", amount_arg="cents", currency_arg="cents")(_money)
    with pytest.raises(ValueError, match="handover_closed"):  # only a hand-over is closed
        tool(name="o_bad_close", handover_closed=HEARD.append)(_money)


def _money(ctx: ToolContext, cents: int) -> dict:
    return {}
