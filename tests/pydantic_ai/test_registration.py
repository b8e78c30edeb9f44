"""What `register_agent(pydantic_ai.Agent)` accepts and what it refuses (no database): each
feature that cannot run durably is a NotDurable naming it, at registration, never mid-run."""

from __future__ import annotations

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import Thinking
from pydantic_ai.models.test import TestModel

from agentruns.registry import Edit, durable, get_agent, get_tool, register_agent
from agentruns.registry.pydantic_agents import NotDurable


def agent(**kwargs) -> Agent:
    return Agent(TestModel(), name=kwargs.pop("name", "pa-reg"), **kwargs)


class Answer(BaseModel):
    text: str


# (structured output, capabilities, instruction and model settings functions, prepare: they run
# in the agent's own loop now, tests/pydantic_ai/test_lifted.py)
REFUSED = {
    "deps without deps=": (lambda: agent(deps_type=dict), "deps_type"),
    "no name": (lambda: Agent(TestModel()), "needs a name"),
}


@pytest.mark.parametrize("feature", list(REFUSED))
def test_features_that_cannot_be_durable_are_refused(feature):
    build, words = REFUSED[feature]
    with pytest.raises(NotDurable, match="cannot run durably|needs a name") as refused:
        register_agent(build())
    assert words in str(refused.value)


def test_a_tool_with_a_prepare_function_registers_as_declared():
    """Its prepare function runs per step in a run (with the run's deps), not at registration:
    the tool is listed as declared, for the permission snapshot."""
    pa = agent(name="pa-prepare", output_type=Answer, capabilities=[Thinking()])

    async def never_at_registration(ctx, tool_def):
        raise AssertionError("prepare ran at registration")

    @pa.tool_plain(prepare=never_at_registration)
    def reg_thing() -> str:
        return "x"

    assert get_agent(register_agent(pa).name).tools == ["reg_thing"]


def test_declarations_map_onto_the_engines_tool():
    pa = agent(name="pa-declared", instructions="Static.", system_prompt="First.")

    @pa.tool(
        metadata=durable(
            side_effect=True,
            idempotency="none",
            editable={"amount": Edit.at_most_requested()},
            amount_arg="amount",
            redact=["card"],
        )
    )
    def reg_charge(ctx: RunContext[None], card: str, amount: int) -> dict:
        """Charge a card."""
        return {}

    @pa.tool_plain(requires_approval=True, metadata={"agentruns": {"side_effect": True}})
    def reg_close(ticket: str) -> str:
        return ticket

    @pa.tool_plain
    def reg_read(ticket: str) -> str:
        return ticket

    registered = register_agent(pa, max_steps=7)
    assert registered.instructions == "First.\n\nStatic."
    assert registered.max_steps == 7 and registered.input_schema["required"] == ["message"]
    charge = get_tool("reg_charge")
    assert (charge.side_effect, charge.idempotency, charge.amount_arg) == (True, "none", "amount")
    assert tuple(charge.redact) == ("card",) and charge.description == "Charge a card."
    assert charge.parameters["required"] == ["card", "amount"]
    assert get_tool("reg_close").needs_approval({"ticket": "T"}) is True
    assert get_tool("reg_read").side_effect is False  # undeclared: no side effect
    assert get_agent("pa-declared").tools == ["reg_charge", "reg_close", "reg_read"]


def test_a_bad_declaration_is_refused():
    with pytest.raises(ValueError, match="unknown key"):
        pa = agent(name="pa-bad")

        @pa.tool_plain(metadata={"agentruns": {"side_efect": True}})
        def reg_typo() -> str:
            return ""

        register_agent(pa)
    with pytest.raises(ValueError, match="idempotency"):
        durable(idempotency="maybe")


def test_deps_come_from_the_run():
    pa = agent(name="pa-deps", deps_type=dict)

    @pa.tool
    def reg_whoami(ctx: RunContext[dict]) -> str:
        return ctx.deps["who"]

    registered = register_agent(pa, deps=lambda run: {"who": run.input["who"]})
    assert registered.tools == ["reg_whoami"]


def test_this_apps_database_errors_stay_the_engines_weather():
    """A database outage under a Pydantic AI tool reaches the engine as the database error it is
    (weather: no attempt, no verdict), never as the tool's "server unreachable": the call as the
    engine makes it, the toolset's `call_tool` inside `classified` (engine/durability.py, `StepsToolset`)."""
    import asyncio

    from django.db import OperationalError
    from pydantic_ai.usage import RunUsage

    from agentruns.registry import RetryableToolError
    from agentruns.registry.pydantic_agents.calls import classified

    pa = agent(name="pa-weather")

    @pa.tool_plain
    def reg_db_down() -> str:
        try:
            raise ConnectionRefusedError("connection refused")
        except ConnectionRefusedError as exc:
            raise OperationalError("the database is down") from exc

    @pa.tool_plain
    def reg_api_down() -> str:
        raise ConnectionRefusedError("connection refused")

    register_agent(pa)
    (toolset,) = pa.toolsets
    ctx = RunContext(deps=None, model=TestModel(), usage=RunUsage())

    async def call(name: str) -> object:
        tool = (await toolset.get_tools(ctx))[name]
        return await classified(name, toolset.call_tool(name, {}, ctx, tool), rerun_safe=False)

    with pytest.raises(OperationalError):
        asyncio.run(call("reg_db_down"))
    with pytest.raises(RetryableToolError, match="unreachable"):
        asyncio.run(call("reg_api_down"))
    with pytest.raises(TypeError, match="runs in a run of that agent"):
        get_tool("reg_api_down").func(None)  # the registry's Tool is not the way to call it
