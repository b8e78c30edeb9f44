"""An MCP server's faults, against the `mcp` SDK's server as a real process (streamable HTTP and
stdio; tests/pydantic_ai/mcp_server.py) and PostgreSQL, asserted on the server's own ledger:
a 429/503 answer (refused before processing) and a server that does not start are weather (no
attempt used; test_mcp_weather.py for long outages); a 500 answer, which may come after the
effect, and a connection that drops mid-call re-run a read-only or idempotent tool under its
retry policy and turn any other into an unknown outcome that a person reconciles through the
API; tool policies and the permission snapshot name MCP tools by their prefixed names."""

from __future__ import annotations

from datetime import datetime

import pytest
from django.contrib.auth.models import Group

from agentruns.models import (
    AttemptOutcome,
    RunStatus,
    Step,
    StepAttempt,
    StepStatus,
    ToolPolicy,
    ToolRule,
)
from agentruns.runtime.events import EventType
from approvals import services
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from tests.crash.kit import attempt_outcomes
from tests.helpers import advance, events, make_user
from tests.pydantic_ai.agents import backoffice, stdio_backoffice
from tests.pydantic_ai.kit import ledger, start
from tests.pydantic_ai.mcp_server import set_faults

pytestmark = pytest.mark.django_db(transaction=True)
MAIL = {"to": "ann@example.com", "text": "Your refund is on its way"}


@pytest.fixture
def http_server(shared_mcp):
    """The module's MCP server over HTTP, its ledger empty and no faults (kit.SharedMcp)."""
    _, url, path = shared_mcp.fresh()
    return url, path


def _agent(transport: str, request, tmp_path) -> tuple[str, str, object]:
    """Register the back office over `transport`: (agent, tool prefix, ledger path)."""
    if transport == "http":
        url, path = request.getfixturevalue("http_server")  # (stdio needs no HTTP server)
        backoffice(url, waive=("bo_set_status", "bo_send_mail"))
        return "pa-mcp", "bo", path
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))
    return "pa-mcp-io", "io", path


def _waits(run) -> list:
    """The step's `step.retry_scheduled` events that say it waits on its server."""
    return [e for e in events(run, EventType.STEP_RETRY_SCHEDULED) if e.data.get("waiting_on")]


@pytest.mark.parametrize("status", [429, 503])
def test_a_429_or_503_answer_is_waited_out_without_an_attempt_and_the_call_made_once(
    status, http_server
):
    url, path = http_server
    backoffice(url, waive=("bo_send_mail",))
    set_faults(path, http_status=[status, 2])  # the next two calls are answered with `status`
    run = advance(start("pa-mcp", ("bo_send_mail", MAIL)))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="bo_send_mail")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.SUCCEEDED)]  # refusals are no attempts
    waits = _waits(run)
    assert len(waits) == 2
    assert all(f"backoffice answered HTTP {status}" in w.data["reason"] for w in waits)
    # the server's Retry-After (1 s) is honoured over the first backoff (0.5 s)
    for wait in waits:
        due = datetime.fromisoformat(wait.data["next_attempt_at"])
        assert (due - wait.created_at).total_seconds() >= 0.95, wait.data
    assert step.result == {"sent": 1}
    assert ledger(path)["mails"] == [MAIL]  # refused twice, sent once


def test_a_500_after_the_effect_of_a_non_idempotent_tool_is_reconciled_never_resent(
    http_server,
):
    """The MCP client reports every HTTP error status alike; a 500 may come after the server
    ran the call (this one does), so a tool that is not idempotent is not sent again."""
    url, path = http_server
    backoffice(url, waive=("bo_send_mail",))
    set_faults(path, http_status_after=[500, 1])
    run = advance(start("pa-mcp", ("bo_send_mail", MAIL)))
    assert run.status == RunStatus.WAITING, run.error
    step = Step.objects.get(run=run, tool="bo_send_mail")
    assert step.status == StepStatus.UNKNOWN
    assert attempt_outcomes(step) == [(1, AttemptOutcome.UNKNOWN)]
    assert "answered HTTP 500" in StepAttempt.objects.get(step=step).error
    item = Approval.objects.get(step=step)
    assert (item.kind, item.status) == (ApprovalKind.RECONCILIATION, ApprovalStatus.PENDING)
    assert ledger(path)["mails"] == [MAIL]  # sent once, never again


@pytest.mark.parametrize(
    ("fault", "tool", "outcomes", "effects"),
    [
        # a gateway's 502 after the server did it: weather for an idempotent tool (no attempt)
        ("http_status_after", "set_status", [(1, AttemptOutcome.SUCCEEDED)], 2),
        # ... and an unknown outcome for one that is not
        ("http_status_after", "send_mail", [(1, AttemptOutcome.UNKNOWN)], 1),
        # a 400 refuses the call before running it: the tool's retry policy
        (
            "http_status",
            "send_mail",
            [(1, AttemptOutcome.RETRYING), (2, AttemptOutcome.SUCCEEDED)],
            1,
        ),
    ],
)
def test_each_other_http_status_by_its_class(fault, tool, outcomes, effects, http_server):
    url, path = http_server
    backoffice(url, waive=(f"bo_{tool}",))
    status = 400 if fault == "http_status" else 502
    set_faults(path, **{fault: [status, 1]})
    args = MAIL if tool == "send_mail" else {"ticket": "T-5", "status": "open"}
    run = advance(start("pa-mcp", (f"bo_{tool}", args)))
    step = Step.objects.get(run=run, tool=f"bo_{tool}")
    assert attempt_outcomes(step) == outcomes, run.error
    book = ledger(path)
    assert len(book.get("mails", [])) + book.get("status_calls", 0) == effects
    assert run.status == (
        RunStatus.WAITING if outcomes[-1][1] == AttemptOutcome.UNKNOWN else RunStatus.SUCCEEDED
    )
    if outcomes == [(1, AttemptOutcome.SUCCEEDED)]:
        assert [w.data["waiting_on"] for w in _waits(run)] == ["backoffice"]


@pytest.mark.parametrize(
    ("tool", "args"),
    [("send_mail", MAIL), ("set_status", {"ticket": "T-4", "status": "open"})],
)
def test_a_call_whose_answer_times_out_is_reconciled_or_retried_by_its_class(
    tool, args, http_server
):
    """The call was sent and the session gave up on its answer: it may have run. Before, the
    timeout reached the model as the tool's error (the model could send the mail again)."""
    url, path = http_server
    backoffice(url, name="pa-mcp-slow", prefix="slow", read_timeout=2, waive=(f"slow_{tool}",))
    set_faults(path, hold_in={tool: 6})  # the effect, then 6 s before the answer (once)
    run = advance(start("pa-mcp-slow", (f"slow_{tool}", args)))
    step = Step.objects.get(run=run, tool=f"slow_{tool}")
    book = ledger(path)
    if tool == "send_mail":
        assert run.status == RunStatus.WAITING, run.error
        assert step.status == StepStatus.UNKNOWN
        assert attempt_outcomes(step) == [(1, AttemptOutcome.UNKNOWN)]
        assert Approval.objects.get(step=step).kind == ApprovalKind.RECONCILIATION
        assert book["mails"] == [MAIL]  # sent once, never again
    else:
        assert run.status == RunStatus.SUCCEEDED, run.error
        assert attempt_outcomes(step) == [
            (1, AttemptOutcome.RETRYING),
            (2, AttemptOutcome.SUCCEEDED),
        ]
        assert book["status_calls"] == 2
    assert "timed out" in StepAttempt.objects.get(step=step, number=1).error


def test_a_500_of_an_idempotent_tool_follows_its_retry_policy(http_server):
    url, path = http_server
    backoffice(url, waive=("bo_set_status",))
    set_faults(path, http_status_after=[500, 1])
    run = advance(start("pa-mcp", ("bo_set_status", {"ticket": "T-9", "status": "closed"})))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="bo_set_status")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.RETRYING), (2, AttemptOutcome.SUCCEEDED)]
    assert (
        "server answered an error: HTTP 500" in StepAttempt.objects.get(step=step, number=1).error
    )
    book = ledger(path)
    assert book["statuses"] == {"T-9": "closed"} and book["status_calls"] == 2


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_a_connection_dropped_mid_call_of_a_non_idempotent_tool_is_reconciled_via_the_api(
    transport, request, tmp_path, api
):
    agent, prefix, path = _agent(transport, request, tmp_path)
    set_faults(path, exit_in="send_mail")  # the server sends it, then dies before answering
    run = advance(start(agent, (f"{prefix}_send_mail", MAIL), say="Mailed:"))
    assert run.status == RunStatus.WAITING, run.error
    step = Step.objects.get(run=run, tool=f"{prefix}_send_mail")
    assert step.status == StepStatus.UNKNOWN
    assert attempt_outcomes(step) == [(1, AttemptOutcome.UNKNOWN)]
    assert "connection broke mid-call" in StepAttempt.objects.get(step=step).error
    item = Approval.objects.get(step=step)
    assert (item.kind, item.status) == (ApprovalKind.RECONCILIATION, ApprovalStatus.PENDING)
    assert ledger(path)["mails"] == [MAIL]  # sent once, never re-run

    response = api.post(
        f"/api/approvals/{item.id}",
        {"decision": "happened", "result": {"sent": 1}, "reason": "the mail is in the outbox"},
    )
    assert response.status_code == 200, response.content
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    step.refresh_from_db()
    assert (step.status, step.result) == (StepStatus.SUCCEEDED, {"sent": 1})
    assert run.output.startswith(f"Mailed: {prefix}_send_mail=")
    assert ledger(path)["mails"] == [MAIL]


def test_a_connection_dropped_mid_call_of_an_idempotent_tool_runs_it_again(tmp_path):
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))
    set_faults(path, exit_in="set_status")
    run = advance(start("pa-mcp-io", ("io_set_status", {"ticket": "T-3", "status": "closed"})))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="io_set_status")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.RETRYING), (2, AttemptOutcome.SUCCEEDED)]
    assert "the connection broke" in StepAttempt.objects.get(step=step, number=1).error
    book = ledger(path)
    assert book["statuses"] == {"T-3": "closed"} and book["status_calls"] == 2


def test_a_stdio_server_that_does_not_come_up_is_waited_for_without_an_attempt(tmp_path):
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))
    set_faults(path, fail_start=[True, 2])  # the next two servers started for the call exit
    run = advance(start("pa-mcp-io", ("io_send_mail", MAIL)))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="io_send_mail")
    assert attempt_outcomes(step) == [(1, AttemptOutcome.SUCCEEDED)]
    waits = _waits(run)
    assert len(waits) == 2 and all("backoffice unreachable" in w.data["reason"] for w in waits)
    assert ledger(path)["mails"] == [MAIL]  # nothing was sent until a server was up: sent once


def test_tool_policies_and_the_snapshot_name_mcp_tools_by_their_prefixed_names(
    http_server, django_user_model, api
):
    url, path = http_server
    backoffice(url, waive=("bo_send_mail",))
    group = Group.objects.create(name="trainees")
    policy = ToolPolicy.objects.create(group=group, other_tools_allowed=True)
    ToolRule.objects.create(policy=policy, tool="bo_send_mail", allowed=False)
    ToolRule.objects.create(policy=policy, tool="bo_get_stock", approval="always")
    trainee = make_user(django_user_model, "trainee", ["agentruns.start_run"])
    trainee.groups.add(group)
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )

    refused = start("pa-mcp", ("bo_send_mail", MAIL), user=trainee)
    tools = refused.permissions["tools"]
    assert tools["bo_send_mail"]["allowed"] is False and tools["bo_get_stock"]["allowed"]
    refused = advance(refused)
    assert refused.status == RunStatus.SUCCEEDED, refused.error
    assert refused.output.startswith("I may not use bo_send_mail.")  # never offered
    assert not Step.objects.filter(run=refused, kind="tool").exists()

    # "always" on a read-only MCP tool: even a read waits for a person
    run = advance(start("pa-mcp", ("bo_get_stock", {"sku": "LAMP"}), user=trainee))
    assert run.status == RunStatus.WAITING
    assert ledger(path) == {}
    services.approve(Approval.objects.get(run=run).id, user=approver)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ledger(path) == {"reads": 1}
    # the API shows the run's snapshot by the same names
    shown = api.get(f"/api/runs/{refused.id}").json()["permissions"]["tools"]
    assert shown["bo_send_mail"]["allowed"] is False
