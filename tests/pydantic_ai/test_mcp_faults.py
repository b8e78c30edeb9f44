"""An MCP server's faults, against the `mcp` SDK's server as a real process (streamable HTTP and
stdio; tests/pydantic_ai/mcp_server.py) and PostgreSQL, asserted on the server's own ledger:
an HTTP error answer (429, 5xx) is a retryable failure with backoff; a connection that drops
mid-call re-runs a read-only or idempotent tool and turns any other into an unknown outcome
that a person reconciles through the API; tool policies and the permission snapshot name MCP
tools by their prefixed names."""

from __future__ import annotations

from collections.abc import Iterator

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
from approvals import services
from approvals.models import Approval, ApprovalKind, ApprovalStatus
from tests.crash.kit import attempt_outcomes
from tests.helpers import advance, make_user
from tests.pydantic_ai.agents import backoffice, stdio_backoffice
from tests.pydantic_ai.kit import SharedMcp, ledger, start
from tests.pydantic_ai.mcp_server import set_faults

pytestmark = pytest.mark.django_db(transaction=True)
MAIL = {"to": "ann@example.com", "text": "Your refund is on its way"}


@pytest.fixture(scope="module")
def shared_mcp(tmp_path_factory) -> Iterator[SharedMcp]:
    server = SharedMcp(tmp_path_factory.mktemp("mcp"))
    yield server
    server.stop()


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


@pytest.mark.parametrize("status", [429, 500, 503])
def test_an_http_error_answer_is_retried_with_backoff_and_the_call_made_once(status, http_server):
    url, path = http_server
    backoffice(url, waive=("bo_send_mail",))
    set_faults(path, http_status=[status, 2])  # the next two calls are answered with `status`
    run = advance(start("pa-mcp", ("bo_send_mail", MAIL)))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="bo_send_mail")
    assert attempt_outcomes(step) == [
        (1, AttemptOutcome.RETRYING),
        (2, AttemptOutcome.RETRYING),
        (3, AttemptOutcome.SUCCEEDED),
    ]
    attempts = list(StepAttempt.objects.filter(step=step).order_by("number"))
    assert all("server answered an error" in a.error for a in attempts[:2])
    # backoff: 1 s then 2 s (+-25% jitter) between the attempts, the same idempotency key
    gaps = [
        (b.started_at - a.finished_at).total_seconds()
        for a, b in zip(attempts, attempts[1:], strict=False)
    ]
    assert gaps[0] >= 0.75 and gaps[1] >= 1.5, gaps
    assert step.result == {"sent": 1}
    assert ledger(path)["mails"] == [MAIL]  # refused twice, sent once


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


def test_a_stdio_server_that_does_not_come_up_is_a_retryable_failure(tmp_path):
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))
    set_faults(path, fail_start=[True, 2])  # the next two servers started for the call exit
    run = advance(start("pa-mcp-io", ("io_send_mail", MAIL)))
    assert run.status == RunStatus.SUCCEEDED, run.error
    step = Step.objects.get(run=run, tool="io_send_mail")
    assert attempt_outcomes(step) == [
        (1, AttemptOutcome.RETRYING),
        (2, AttemptOutcome.RETRYING),
        (3, AttemptOutcome.SUCCEEDED),
    ]
    assert all(
        "server unreachable" in a.error for a in StepAttempt.objects.filter(step=step, number__lt=3)
    )
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
