"""MCP toolsets as tool steps (in process, PostgreSQL, the `mcp` SDK's server as a real process
over streamable HTTP and over stdio): the tools' annotations set the engine's defaults, calls
are counted by the server's own ledger, a side-effect tool parks for approval unless the
registration waives it; a server that is down is weather the run waits out (test_mcp_weather.py)."""

from __future__ import annotations

import pytest

from agentruns.models import RunStatus, Step
from agentruns.registry import Edit
from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.helpers import advance, make_user, tasks_on_the_process_loop
from tests.pydantic_ai.agents import backoffice, stdio_backoffice
from tests.pydantic_ai.kit import ledger, start, stdio_transport

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def mcp(shared_mcp):
    """The module's MCP server, its ledger empty (kit.SharedMcp)."""
    return shared_mcp.fresh()


def test_annotations_set_the_defaults_a_registration_may_waive(mcp):
    _, url, _ = mcp
    backoffice(url, name="pa-mcp-strict", prefix="strict")
    backoffice(url, name="pa-mcp", waive=("bo_send_mail",))
    with pytest.raises(ValueError, match="already registered"):  # tool names are global
        backoffice(url, name="pa-mcp-other")
    strict = {
        name.replace("strict_", "bo_"): policy
        for name, policy in start("pa-mcp-strict").tool_snapshot.items()
    }
    assert strict["bo_get_stock"]["side_effect"] is False  # readOnlyHint
    assert strict["bo_get_stock"]["approval"] is False
    assert (strict["bo_set_status"]["idempotency"], strict["bo_set_status"]["approval"]) == (
        "key",  # idempotentHint: run again after a crash
        True,  # not read-only: needs approval unless the registration says otherwise
    )
    assert (strict["bo_send_mail"]["idempotency"], strict["bo_send_mail"]["approval"]) == (
        "none",  # neither: an unknown outcome after a crash, reconciled in the inbox
        True,
    )
    assert start("pa-mcp").tool_snapshot["bo_send_mail"]["approval"] is False


def test_calls_over_streamable_http_are_steps_the_server_counts_once(mcp):
    _, url, path = mcp
    backoffice(url, waive=("bo_set_status",))
    run = advance(
        start(
            "pa-mcp",
            ("bo_get_stock", {"sku": "LAMP"}),
            ("bo_set_status", {"ticket": "T-1", "status": "closed"}),
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    stock, status = (Step.objects.get(run=run, tool=t) for t in ("bo_get_stock", "bo_set_status"))
    assert stock.result == {"sku": "LAMP", "stock": 7}
    assert status.result == {"ticket": "T-1", "status": "closed"} and status.attempts == 1
    assert ledger(path) == {"reads": 1, "statuses": {"T-1": "closed"}, "status_calls": 1}


def test_a_side_effect_mcp_tool_parks_for_approval_by_default(mcp, django_user_model):
    _, url, path = mcp
    # the registration declares what an approver may edit (an MCP tool declares nothing)
    backoffice(
        url,
        name="pa-mcp-strict",
        prefix="strict",
        declare={"strict_send_mail": {"editable": {"text": Edit.free()}}},
    )
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = advance(
        start("pa-mcp-strict", ("strict_send_mail", {"to": "ann@example.com", "text": "Hi"}))
    )
    assert run.status == RunStatus.WAITING
    assert ledger(path) == {}  # nothing sent before a person decided
    approval = Approval.objects.get(run=run, status=ApprovalStatus.PENDING)
    services.approve(approval.id, user=approver, edited_args={"text": "Hello"})
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ledger(path) == {"mails": [{"to": "ann@example.com", "text": "Hello"}]}


def test_a_stdio_server(tmp_path):
    path = tmp_path / "stdio-ledger.json"
    stdio_backoffice(str(path))
    run = advance(
        start(
            "pa-mcp-io",
            ("io_get_stock", {"sku": "DESK"}),
            ("io_send_mail", {"to": "cy@example.com", "text": "Shipped"}),
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ledger(path) == {"reads": 1, "mails": [{"to": "cy@example.com", "text": "Shipped"}]}


def test_a_stdio_servers_session_ends_with_its_call_though_fastmcp_would_keep_it(tmp_path):
    """FastMCP keeps a stdio session alive after its client exits by default (the README's
    `MCPToolset("server.py")`): the session, its server process and its tasks stayed on the
    process's run loop after the run, in the context of the call that opened them."""
    path = tmp_path / "kept-ledger.json"
    transport = stdio_transport(path, keep_alive=None)
    assert transport.keep_alive is True  # (FastMCP's default)
    backoffice(transport, name="pa-mcp-kept", prefix="kept", waive=("kept_set_status",))
    run = advance(
        start(
            "pa-mcp-kept",
            ("kept_get_stock", {"sku": "DESK"}),
            ("kept_set_status", {"ticket": "T-2", "status": "open"}),
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert ledger(path) == {"reads": 1, "statuses": {"T-2": "open"}, "status_calls": 1}
    assert tasks_on_the_process_loop() == 0
