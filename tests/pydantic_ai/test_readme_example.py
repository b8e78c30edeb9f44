"""The README's "Bring your Pydantic AI agent" example is examples/pydantic_ai/agent.py, printed
whole, and it runs: registered with its stdio MCP server, driven by Pydantic AI's TestModel
(which calls every tool once), its side-effect tool gets its key and its approval tool parks."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentruns.models import RunStatus, Step, StepStatus
from agentruns.services import start_run
from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.helpers import advance, make_user

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_prints_the_example_whole():
    example = (ROOT / "examples/pydantic_ai/agent.py").read_text()
    assert f"```python\n{example}```" in (ROOT / "README.md").read_text()
    assert len(example.splitlines()) < 30


@pytest.mark.django_db(transaction=True)
def test_the_example_runs(django_user_model):
    import examples.pydantic_ai.agent  # noqa: F401  (registers "shop")

    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = start_run("shop", {"message": "Please refund ORD-1001."}, model="test").run
    snapshot = run.tool_snapshot
    assert snapshot["bo_order_status"]["side_effect"] is False  # readOnlyHint
    assert snapshot["bo_tag_ticket"]["idempotency"] == "key"  # idempotentHint
    assert snapshot["refund"]["side_effect"] and snapshot["close_account"]["approval"] is True
    for _ in range(4):  # TestModel calls every tool once; two of them need approval
        run = advance(run)
        if run.status != RunStatus.WAITING:
            break
        for approval in Approval.objects.filter(run=run, status=ApprovalStatus.PENDING):
            services.approve(approval.id, user=approver)
    assert run.status == RunStatus.SUCCEEDED, run.error
    refund = Step.objects.get(run=run, tool="refund")
    assert refund.status == StepStatus.SUCCEEDED
    assert refund.result["idempotency_key"] == refund.idempotency_key
    assert Step.objects.get(run=run, tool="close_account").result.startswith("account ")
    assert "shipped yesterday" in str(Step.objects.get(run=run, tool="bo_order_status").result)
