"""The README's "Bring your Pydantic AI agent" example runs as printed: the block is taken out of
README.md and executed (it is also examples/pydantic_ai/agent.py, whole), registered with its
stdio MCP server, driven by Pydantic AI's TestModel (which calls every tool once): its
side-effect tool gets its idempotency key, its approval tool parks the run for a person, and
the run finishes once approved."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from agentruns.models import RunStatus, Step, StepStatus
from agentruns.services import start_run
from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.helpers import ApiClient, advance, make_user

ROOT = Path(__file__).resolve().parents[2]


def readme_example() -> str:
    """The first Python block under the README's "Bring your Pydantic AI agent"."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Bring your Pydantic AI agent") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_prints_the_example_whole():
    example = readme_example()
    assert example == (ROOT / "examples/pydantic_ai/agent.py").read_text()
    assert len(example.splitlines()) < 30


@pytest.mark.django_db(transaction=True)
def test_the_readme_example_runs_as_printed(django_user_model, monkeypatch):
    monkeypatch.chdir(ROOT)  # its MCP server's path is relative to the checkout, as printed
    module = types.ModuleType("readme_example")
    exec(compile(readme_example(), "README.md", "exec"), module.__dict__)  # registers "shop"

    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = start_run("shop", {"message": "Please refund ORD-1001."}, model="test").run
    snapshot = run.tool_snapshot
    assert snapshot["bo_order_status"]["side_effect"] is False  # readOnlyHint
    assert snapshot["bo_tag_ticket"]["idempotency"] == "key"  # idempotentHint
    assert snapshot["refund"]["side_effect"] and snapshot["close_account"]["approval"] is True
    asked = set()
    for _ in range(4):  # TestModel calls every tool once; two of them need approval
        run = advance(run)
        if run.status != RunStatus.WAITING:
            break
        for approval in Approval.objects.filter(run=run, status=ApprovalStatus.PENDING):
            asked.add(approval.step.tool)
            services.approve(approval.id, user=approver)
    assert asked == {"close_account", "bo_tag_ticket"}  # parked for a person, then went on
    assert run.status == RunStatus.SUCCEEDED, run.error
    refund = Step.objects.get(run=run, tool="refund")
    assert refund.status == StepStatus.SUCCEEDED
    assert refund.result["idempotency_key"] == refund.idempotency_key  # current_step()
    assert Step.objects.get(run=run, tool="close_account").result.startswith("account ")
    assert "shipped yesterday" in str(Step.objects.get(run=run, tool="bo_order_status").result)


def readme_structured_example() -> str:
    """The second Python block under "Bring your Pydantic AI agent": a structured-output agent."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Bring your Pydantic AI agent") :]
    return re.findall(r"```python\n(.*?)```", section, re.S)[1]


@pytest.mark.django_db(transaction=True)
def test_the_readmes_structured_output_agent_runs_as_printed(django_user_model):
    module = types.ModuleType("readme_structured")
    exec(compile(readme_structured_example(), "README.md", "exec"), module.__dict__)

    run = start_run("triage", {"message": "ORD-1001 arrived broken"}, model="test").run
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    # TestModel answers through the output tool with arguments made from the schema
    assert run.output_data == {"order_id": "a", "amount_cents": 0}
    viewer = make_user(django_user_model, "viewer", ["agentruns.view_run"])
    assert ApiClient(viewer).get(f"/api/runs/{run.id}").json()["output"] == run.output_data
