"""Concurrency keys (runtime/dispatch/concurrency.py) in this process on PostgreSQL: runs sharing
a key beyond the agent's limit wait queued in start order saying which run they wait behind;
nothing claims them (the claimers' statement, a doorbell's claim, the sweeper, the re-let) until
the end of the run ahead admits them in the same transaction; a parked run keeps its place unless
its agent lets it go; a cancel, a retry, a fork and a crashed holder; runs without a key are
unaffected and a claim is still one statement; priority orders the claim, through its index.

Real worker clusters (a SIGKILLed holder, the sampled cluster): tests/crash/test_concurrency_keys.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django_q.models import OrmQ

from agentruns.models import ConcurrencyKey, Run, RunStatus
from agentruns.registry import Agent, register_agent
from agentruns.registry.run_input.concurrency import concurrency_of
from agentruns.runtime.dispatch import claims, concurrency
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.execution import transitions
from agentruns.runtime.workers.sweeper import sweep
from agentruns.services import cancel_run, fork_run, retry_run, start_run
from approvals import services as approval_services
from approvals.models import Approval
from tests import testkit
from tests.helpers import advance, assert_gapless, events, steps
from tests.testkit import TOOLS, script_policy

pytestmark = pytest.mark.django_db(transaction=True)

for name, options in (
    ("lined", {}),
    ("lined-release", {"release_while_waiting": True}),
    ("lined-two", {"concurrency": 2}),
):
    register_agent(
        Agent(
            name=name, instructions="Follow the script.", tools=TOOLS, scripted_policy=script_policy
        ),
        concurrency_key=lambda run_input: run_input.get("order"),
        **options,
    )

DONE = [{"text": "done"}]
PAYS = [{"calls": [["t_pay", {"amount": 500}]]}, {"text": "paid"}]  # parks for approval
FAILS = [{"calls": [["t_explode", {}]]}, {"text": "never"}]


def keyed(order: str = "ORD-1", turns: list | None = None, agent: str = "lined", **start) -> Run:
    return start_run(agent, {"script": turns or DONE, "order": order}, **start).run


def fresh(run: Run) -> Run:
    return Run.objects.get(id=run.id)


CLAIMED: dict = {}  # run id -> the run as the claim returned it


def claim_all() -> set:
    taken = claims.claim_queued(50, transitions.started().events)
    CLAIMED.update({r.id: r for r in taken})
    return {r.id for r in taken}


def execute_claimed(run: Run) -> str:
    """Execute a run the claim took, as a claimer's pool thread does."""
    claimed = CLAIMED.pop(run.id)
    return RunExecutor(run.id, claimed.lease_owner).advance(claimed=claimed)


def reasons(run: Run) -> list[str]:
    return [e.data.get("reason", "") for e in events(run, "run.status") if e.data.get("reason")]


def rung(run: Run) -> int:
    """q2 doorbells written for the run."""
    return sum(1 for task in OrmQ.objects.all() if str(run.id) in str(task.task["args"]))


def test_runs_sharing_a_key_wait_in_start_order_saying_which_run_they_wait_behind():
    a, b, c = keyed(), keyed(), keyed()
    other_order, no_key = keyed("ORD-2"), start_run("script", {"script": DONE}).run
    a, b, c = fresh(a), fresh(b), fresh(c)
    assert a.holds_key and a.waiting_behind is None
    assert (b.waiting_behind, c.waiting_behind) == (a.id, b.id)
    assert b.status == c.status == RunStatus.QUEUED and b.enqueued_at is None
    assert f"waiting behind run {str(a.id)[:8]}" in reasons(b)[0]
    assert f"waiting behind run {str(b.id)[:8]}" in reasons(c)[0]

    # nothing claims a run in line: the claimers, a doorbell's claim, the sweeper
    assert claim_all() == {a.id, fresh(other_order).id, no_key.id}
    assert RunExecutor(b.id).advance() == "busy"
    sweep(timezone.now() + timedelta(minutes=10))
    assert rung(b) == rung(c) == 0 and fresh(b).status == RunStatus.QUEUED

    for run in (a, other_order, no_key):
        assert execute_claimed(run) == RunStatus.SUCCEEDED
    # a's end admitted b (and only b: the limit is 1): claimable now, and it says why
    b, c = fresh(b), fresh(c)
    assert b.holds_key and b.waiting_behind is None and b.enqueued_at is not None
    assert f"run {str(a.id)[:8]} let concurrency key ORD-1 go" in reasons(b)[-1]
    assert c.waiting_behind == b.id and not fresh(a).holds_key
    assert claim_all() == {b.id}
    assert execute_claimed(b) == RunStatus.SUCCEEDED
    assert fresh(c).holds_key
    assert advance(c).status == RunStatus.SUCCEEDED
    # the last run of the key let it go: its row is gone, the line is empty
    assert not ConcurrencyKey.objects.filter(agent="lined", key="ORD-1").exists()
    for run in (a, b, c):
        assert_gapless(run)


def test_the_release_commits_with_the_runs_end_or_not_at_all(monkeypatch):
    a, b = keyed(), keyed()
    ring = concurrency._ring

    def ring_then_lose_the_lease(run_ids):
        ring(run_ids)
        # in the same transaction, right before the end's fenced commit: the fence fails
        Run.objects.filter(id=a.id).update(lease_owner="another-worker")

    monkeypatch.setattr(concurrency, "_ring", ring_then_lose_the_lease)
    assert advance(a).status == RunStatus.RUNNING  # lease lost: nothing of the end was written
    assert fresh(a).holds_key and fresh(b).waiting_behind == a.id
    assert fresh(a).lease_owner != "another-worker"
    monkeypatch.setattr(concurrency, "_ring", ring)
    Run.objects.filter(id=a.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert advance(a).status == RunStatus.SUCCEEDED
    assert fresh(b).holds_key


def test_a_run_parked_for_approval_keeps_its_place():
    a = advance(keyed(turns=PAYS))
    b = keyed()
    assert a.status == RunStatus.WAITING and fresh(a).holds_key
    assert fresh(b).waiting_behind == a.id and claim_all() == set()
    approval_services.approve(Approval.objects.get(run=a).id, user=None)
    assert fresh(a).holds_key and fresh(b).waiting_behind == a.id  # resumed: still its place
    assert advance(a).status == RunStatus.SUCCEEDED
    assert advance(b).status == RunStatus.SUCCEEDED


def test_an_agent_may_let_a_parked_runs_place_go_and_it_queues_again_when_resumed():
    a = advance(keyed(turns=PAYS, agent="lined-release"))
    b = keyed(agent="lined-release")
    assert a.status == RunStatus.WAITING and not fresh(a).holds_key
    assert fresh(b).holds_key  # nobody held the key while a waited: admitted at start
    b_claimed = claim_all()
    assert b_claimed == {b.id}
    approval_services.approve(Approval.objects.get(run=a).id, user=None)
    a = fresh(a)
    # back in line in start order, behind the run that holds the key now
    assert a.status == RunStatus.QUEUED and a.waiting_behind == b.id and a.enqueued_at is None
    assert f"waiting behind run {str(b.id)[:8]}" in reasons(a)[-1]
    assert advance(a).status == RunStatus.QUEUED  # its doorbell finds it in line
    assert execute_claimed(b) == RunStatus.SUCCEEDED
    assert fresh(a).holds_key
    assert advance(a).status == RunStatus.SUCCEEDED
    assert [s.status for s in steps(a, "tool")] == ["succeeded"]


def test_cancelling_a_run_in_line_or_the_holder_moves_the_line_on():
    a, b, c, d = keyed(), keyed(), keyed(), keyed()
    cancel_run(b.id, reason="a duplicate ticket")
    assert fresh(b).status == RunStatus.CANCELLED and fresh(b).waiting_behind is None
    assert fresh(c).waiting_behind == a.id  # the run ahead of b is now ahead of c
    assert f"waiting behind run {str(a.id)[:8]}" in reasons(c)[-1]
    cancel_run(a.id)  # the holder, admitted but not claimed yet
    assert fresh(c).holds_key and fresh(d).waiting_behind == c.id
    assert claim_all() == {c.id}
    for run in (a, b, c, d):
        assert_gapless(run)


def test_a_retry_and_a_fork_take_the_key_again():
    a = advance(keyed(turns=FAILS))
    assert a.status == RunStatus.FAILED and not fresh(a).holds_key
    b = keyed()
    assert fresh(b).holds_key
    retry_run(a.id)
    a = fresh(a)
    assert a.status == RunStatus.QUEUED and a.waiting_behind == b.id
    assert advance(a).status == RunStatus.QUEUED  # the retry's doorbell finds it in line
    done = advance(b)
    assert done.status == RunStatus.SUCCEEDED and fresh(a).holds_key

    fork = fork_run(done.id, 0)
    assert fork.concurrency_key == "ORD-1" and fork.waiting_behind == a.id
    assert advance(fork).status == RunStatus.QUEUED
    assert advance(a).status == RunStatus.FAILED  # t_explode fails again: it lets the key go
    assert fresh(fork).holds_key and advance(fork).status == RunStatus.SUCCEEDED


def test_a_crashed_holder_keeps_its_key_while_it_is_recovered():
    a, b = keyed(), keyed()
    assert claim_all() == {a.id}
    # its worker died: the lease lapsed with the run running
    Run.objects.filter(id=a.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    sweep(timezone.now() + timedelta(minutes=10))
    assert rung(a) == 1 and rung(b) == 0
    relet = claims.relet_abandoned(10)
    assert [r.id for r in relet] == [a.id]
    assert fresh(b).waiting_behind == a.id and fresh(a).holds_key
    assert RunExecutor(a.id, relet[0].lease_owner).advance(claimed=relet[0]) == "succeeded"
    assert fresh(b).holds_key


def test_a_limit_above_one_admits_that_many():
    runs = [keyed(agent="lined-two") for _ in range(4)]
    held = [r.id for r in runs if fresh(r).holds_key]
    assert held == [runs[0].id, runs[1].id]
    assert fresh(runs[2]).waiting_behind == runs[0].id  # the oldest holder
    assert fresh(runs[3]).waiting_behind == runs[2].id
    assert advance(runs[1]).status == RunStatus.SUCCEEDED
    # the first of the line waits behind the oldest holder
    assert fresh(runs[2]).holds_key and fresh(runs[3]).waiting_behind == runs[0].id


@pytest.mark.parametrize(
    "options, error",
    [
        ({"concurrency_key": "order_id"}, "must be a function"),
        ({"concurrency_key": lambda i: i, "concurrency": 0}, "at least 1"),
        ({"concurrency_key": lambda i: i, "concurrency": True}, "at least 1"),
        ({"concurrency_key": lambda i: i, "release_while_waiting": "yes"}, "True or False"),
        ({"concurrency": 2}, "need a concurrency_key"),
    ],
)
def test_a_declaration_that_cannot_work_fails_at_registration(options, error):
    with pytest.raises((TypeError, ValueError), match=error):
        register_agent(Agent(name="lined-bad", instructions="-", tools=TOOLS), **options)


def test_a_pydantic_ai_agent_declares_a_key_the_same_way():
    from pydantic_ai import Agent as PydanticAgent
    from pydantic_ai.models.test import TestModel

    register_agent(
        PydanticAgent(TestModel(), name="lined-pa"),
        concurrency_key=lambda run_input: run_input.get("order"),
        concurrency=3,
    )
    declared = concurrency_of("lined-pa")
    assert declared is not None and declared.limit == 3 and not declared.release_while_waiting
    run = start_run("lined-pa", {"message": "hi", "order": "ORD-9"}).run
    assert fresh(run).concurrency_key == "ORD-9" and fresh(run).holds_key
    register_agent(PydanticAgent(TestModel(), name="lined-pa"))  # registered again without one
    assert concurrency_of("lined-pa") is None


def test_a_key_the_input_cannot_give_refuses_the_start():
    with pytest.raises(ValueError, match="concurrency key"):
        start_run("lined", {"script": DONE, "order": "x" * 201})
    no_key = start_run("lined", {"script": DONE}).run  # the function answered None: no key
    assert no_key.concurrency_key is None and fresh(no_key).holds_key is False


def test_runs_without_a_key_claim_in_one_statement_and_take_no_key_lock():
    with CaptureQueriesContext(connection) as start:
        plain = start_run("script", {"script": DONE}).run
    assert len(start) == 1  # the one start statement, as before
    with CaptureQueriesContext(connection) as claim:
        taken = claims.claim_queued(10, transitions.started().events)
    assert [r.id for r in taken] == [plain.id] and len(claim) == 1
    with CaptureQueriesContext(connection) as drive:
        assert RunExecutor(plain.id, taken[0].lease_owner).advance(claimed=taken[0]) == "succeeded"
    assert not any("concurrencykey" in q["sql"] for q in drive.captured_queries)


def test_priority_orders_the_claim_and_its_index_serves_it():
    low, default, high, higher = (
        start_run("script", {"script": DONE}, priority=p).run for p in (-5, 0, 7, 7)
    )
    taken = [claims.claim_queued(1, transitions.started().events)[0].id for _ in range(4)]
    assert taken == [high.id, higher.id, default.id, low.id]  # then age within a priority

    # the plan over a backlog: the claim walks run_claim_idx in its order, no sort
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO agentruns_run (id, agent, input, status, model, tool_snapshot, "
            "permissions, max_steps, lease_owner, enqueued_at, cancel_requested, step_count, "
            "last_seq, prompt_tokens, completion_tokens, cost_usd, output, error, stop_reason, "
            "search_text, trace_id, trace_parent, created_at, updated_at, priority, holds_key) "
            "SELECT gen_random_uuid(), 'script', '{}', 'queued', '', '{}', '{}', 25, '', "
            "now() - interval '1 hour', false, 0, 0, 0, 0, 0, '', '', '', '', '', '', now(), "
            "now(), (g % 7) - 3, false FROM generate_series(1, 5000) g"
        )
        cursor.execute("ANALYZE agentruns_run")
    with CaptureQueriesContext(connection) as claim:
        claims.claim_queued(5, transitions.started().events)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + claim.captured_queries[0]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "run_claim_idx" in plan and "Sort" not in plan, plan


def test_gateway_ledger_untouched_by_runs_in_line():
    # a run in line executes nothing: its tool was never called
    a, b = (
        keyed(turns=[{"calls": [["t_charge", {"amount": 3}]]}, {"text": "ok"}]),
        keyed(turns=[{"calls": [["t_charge", {"amount": 4}]]}, {"text": "ok"}]),
    )
    assert advance(b).status == RunStatus.QUEUED
    assert testkit.CALLS["t_charge"] == []
    assert advance(a).status == RunStatus.SUCCEEDED and advance(b).status == RunStatus.SUCCEEDED
    assert [args for _, _, args in testkit.CALLS["t_charge"]] == [{"amount": 3}, {"amount": 4}]
