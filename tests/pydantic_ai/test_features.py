"""docs/pydantic-ai.md's feature list, held to what it says: every feature it lists as "refused"
is a NotDurable naming it when the agent registers (checks.py), never a surprise mid-run (the
features that run on the agent's own loop: test_lifted.py); the
toolsets of each kind it lists as durable (combined, renamed, filtered, approval-marking,
metadata-setting, return-schema-including, a user's own wrapper) register, and their calls run
as tool steps with the semantics they declare (PostgreSQL). `MCPToolset`, prefixed: test_mcp*.py.
"""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, CallDeferred
from pydantic_ai.models.test import TestModel
from pydantic_ai.toolsets import CombinedToolset, FunctionToolset, WrapperToolset

from agentruns.models import RunStatus, Step, StepStatus, Wait, WaitStatus
from agentruns.registry import get_agent, get_tool, register_agent
from agentruns.registry.pydantic_agents import NotDurable
from agentruns.runtime.engine.durability import AgentRunsDurability
from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.helpers import advance, make_user
from tests.pydantic_ai.agents import play
from tests.pydantic_ai.kit import start


def _agent(**kwargs) -> Agent:
    return Agent(TestModel(), name=kwargs.pop("name", "pa-feature"), **kwargs)


def _with_tool(**tool_options) -> Agent:
    pa = _agent()

    @pa.tool_plain(**tool_options)
    def feat_tool() -> str:
        return ""

    return pa


# feature -> (an agent using it, the words the refusal names it with); the features once refused
# here and now run on the agent's own loop each have their test in test_lifted.py
REFUSED = {
    "a tool's defer_loading": (lambda: _with_tool(defer_loading=True), "defer_loading"),
    "DeferredLoadingToolset": (
        lambda: _agent(toolsets=[FunctionToolset().defer_loading()]),
        "deferred loading",
    ),
    "a second durable engine": (
        lambda: _agent(capabilities=[AgentRunsDurability(name="other")]),
        "one durable engine",
    ),
}


@pytest.mark.parametrize("feature", list(REFUSED))
def test_each_refused_feature_is_refused_at_registration_by_name(feature):
    build, words = REFUSED[feature]
    with pytest.raises(NotDurable, match="cannot run durably") as refused:
        register_agent(build())
    assert words in str(refused.value)


def test_the_docs_list_every_refusal():
    """Each refusal above has its row in docs/pydantic-ai.md (the docs cannot drop one)."""
    from tests.procs import ROOT

    docs = (ROOT / "docs/pydantic-ai.md").read_text()
    for name in (
        "ToolOutput",
        "NativeOutput",
        "PromptedOutput",
        "@agent.output_validator",
        "ProcessHistory",
        "WebSearch",
        "ProcessEventStream",
        "validation_context",
        "tool_timeout",
        "defer_loading",
        "PreparedToolset",
        "DeferredLoadingToolset",
        "ExternalToolset",
        "DynamicToolset",
        "raise CallDeferred",
    ):
        assert f"`{name}" in docs, name


class Audited(WrapperToolset):
    """A user's own wrapper: it sees every call, inside the tool step."""

    calls: list[str] = []

    async def call_tool(self, name, tool_args, ctx, tool):
        Audited.calls.append(name)
        return await super().call_tool(name, tool_args, ctx, tool)


def _kinds_agent() -> Agent:
    def feat_add(a: int, b: int) -> int:
        return a + b

    def feat_secret() -> str:
        return "never offered"

    def feat_wipe(ticket: str) -> str:
        return f"wiped {ticket}"

    def feat_charge(cents: int) -> dict:
        return {"charged": cents}

    def feat_defer() -> str:
        raise CallDeferred()

    math = FunctionToolset([feat_add, feat_secret]).filtered(
        lambda ctx, tool_def: tool_def.name != "feat_secret"  # once, at registration
    )
    wiping = Audited(FunctionToolset([feat_wipe])).approval_required(
        lambda ctx, tool_def, args: args.get("ticket") != "T-0"
    )
    charging = (
        FunctionToolset([feat_charge])
        .include_return_schemas()
        .with_metadata(agentruns={"side_effect": True, "idempotency": "key", "amount_arg": "cents"})
    )
    from pydantic_ai.models.function import FunctionModel

    return Agent(
        FunctionModel(stream_function=play, model_name="kinds-script"),
        name="pa-kinds",
        toolsets=[
            CombinedToolset([math.renamed({"feat_plus": "feat_add"}), wiping]),
            charging,
            FunctionToolset([feat_defer]),
        ],
    )


@pytest.mark.django_db(transaction=True)
def test_toolsets_of_each_kind_run_as_tool_steps(django_user_model):
    register_agent(_kinds_agent())
    assert get_agent("pa-kinds").tools == ["feat_plus", "feat_wipe", "feat_charge", "feat_defer"]
    assert get_tool("feat_charge").side_effect and get_tool("feat_charge").idempotency == "key"

    run = advance(start("pa-kinds", ("feat_plus", {"a": 2, "b": 3}), ("feat_charge", {"cents": 7})))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="feat_plus").result == 5  # renamed, filtered, combined
    charge = Step.objects.get(run=run, tool="feat_charge")
    assert charge.result == {"charged": 7} and charge.idempotency_key

    Audited.calls.clear()
    free = advance(start("pa-kinds", ("feat_wipe", {"ticket": "T-0"})))
    assert free.status == RunStatus.SUCCEEDED, free.error
    assert Audited.calls == ["feat_wipe"]  # the user's wrapper saw the call
    # .approval_required(): the toolset's own rule parks the call in the inbox
    approver = make_user(
        django_user_model, "approver", ["approvals.decide_approval", "approvals.view_approval"]
    )
    run = advance(start("pa-kinds", ("feat_wipe", {"ticket": "T-9"})))
    assert run.status == RunStatus.WAITING, run.error
    assert Audited.calls == ["feat_wipe"]  # asked, not done
    services.approve(Approval.objects.get(run=run, status=ApprovalStatus.PENDING).id, user=approver)
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="feat_wipe").result == "wiped T-9"


@pytest.mark.django_db(transaction=True)
def test_call_deferred_waits_for_its_result_by_token():
    """(It was refused when raised; its result now arrives by token: test_lifted.py.)"""
    register_agent(_kinds_agent())
    run = advance(start("pa-kinds", ("feat_defer", {})))
    assert run.status == RunStatus.WAITING, run.error
    step = Step.objects.get(run=run, tool="feat_defer")
    assert step.status == StepStatus.PENDING and step.result is None
    assert Wait.objects.get(run=run).status == WaitStatus.PENDING
