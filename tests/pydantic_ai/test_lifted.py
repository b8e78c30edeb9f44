"""The Pydantic AI features the engine once refused, each run through `register_agent` on the
agent's own loop, in process against PostgreSQL: structured output (a model class, ToolOutput,
NativeOutput, PromptedOutput, a union, an output function), output validators sending the model
back, instruction, system prompt and model settings functions, deps, capabilities (a history
processor, Thinking, a builtin tool, ModelFallback, hooks), `prepare`, a dynamic toolset,
`validation_context`, `tool_timeout`, deferred tools whose results arrive by token
(`CallDeferred`, `ExternalToolset`) and models that cannot stream.

The model is a `FunctionModel` without a stream function (it cannot stream) playing the run's
message: {"calls": [[tool, args], ...], "output": <the final answer>}: turn i asks for call i,
then it answers with `output` (through the output tool when the agent has one, else as text).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group
from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic_ai import Agent, CallDeferred, ModelRetry, RunContext
from pydantic_ai.capabilities import (
    Hooks,
    ModelFallback,
    ProcessEventStream,
    ProcessHistory,
    Thinking,
    WebSearch,
)
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.output import NativeOutput, PromptedOutput, TextOutput, ToolOutput
from pydantic_ai.profiles import ModelProfile
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset, FunctionToolset

from agentruns.models import RunStatus, Step, StepStatus, ToolPolicy, ToolRule, Wait, WaitStatus
from agentruns.registry import register_agent
from agentruns.runtime.execution.transitions import WaitAlreadyResolved, resolve_wait
from agentruns.services import start_run
from tests.helpers import ApiClient, advance, events, make_user, steps
from tests.pydantic_ai.agents import play
from tests.pydantic_ai.kit import planned

pytestmark = pytest.mark.django_db


class Refund(BaseModel):
    order_id: str
    amount_cents: int


class Escalation(BaseModel):
    reason: str


# what each model request saw (instructions, settings, tools offered), newest last
seen: list[AgentInfo] = []
conversations: list[list[ModelMessage]] = []


def answers(messages: list[ModelMessage]) -> list[str]:
    """What the tools answered in the last request (returns and retry prompts)."""
    last = messages[-1]
    if not isinstance(last, ModelRequest):
        return []
    return [
        f"{p.tool_name}={p.content}"
        for p in last.parts
        if isinstance(p, ToolReturnPart | RetryPromptPart) and p.tool_name
    ]


def plays(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The whole turn at once (no stream function: this model cannot stream)."""
    seen.append(info)
    conversations.append(list(messages))
    plan = planned(messages)
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    calls = plan.get("calls", [])
    if turn < len(calls):
        name, args = calls[turn]
        return ModelResponse(parts=[ToolCallPart(name, json.dumps(args), tool_call_id=f"c{turn}")])
    retried = sum(  # the final answers sent back (by an output validator or function)
        (isinstance(p, RetryPromptPart) and not p.tool_name)
        or (getattr(p, "tool_call_id", None) == "out" and getattr(p, "outcome", "") == "retried")
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
    )
    outputs = plan.get("outputs") or [plan.get("output", "Done.")]
    output = outputs[min(retried, len(outputs) - 1)]
    if info.output_tools and not isinstance(output, str):
        tool = info.output_tools[0]
        return ModelResponse(
            parts=[ToolCallPart(tool.name, json.dumps(output), tool_call_id="out")]
        )
    text = output if isinstance(output, str) else json.dumps(output)
    return ModelResponse(parts=[TextPart(text)])


def whole_model(name: str = "whole") -> FunctionModel:
    return FunctionModel(function=plays, model_name=name)


def start(agent: str, *calls: tuple[str, dict], **plan: object):
    message = json.dumps({"calls": [list(c) for c in calls], **plan})
    return start_run(agent, {"message": message}).run


@pytest.fixture(autouse=True)
def _fresh_record():
    seen.clear()
    conversations.clear()


# ------------------------------------------------------------------ models that cannot stream
def test_a_model_that_cannot_stream_answers_whole():
    pa = Agent(whole_model(), name="lift-whole")

    @pa.tool_plain
    def lift_lookup(order_id: str) -> dict:
        return {"order_id": order_id, "amount_cents": 4200}

    register_agent(pa)
    run = advance(start("lift-whole", ("lift_lookup", {"order_id": "O-1"}), output="Found."))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert [(s.kind, s.tool, s.status) for s in steps(run)] == [
        ("model", "", "succeeded"),
        ("tool", "lift_lookup", "succeeded"),
        ("model", "", "succeeded"),
    ]
    assert run.output == "Found."


# ------------------------------------------------------------------ structured output
def _refund_from_text(text: str) -> Refund:
    return Refund.model_validate_json(text)


OUTPUT_TYPES = {
    "a model class": Refund,
    "ToolOutput": ToolOutput(Refund, name="final_refund"),
    "NativeOutput": NativeOutput(Refund),
    "PromptedOutput": PromptedOutput(Refund),
    "a union": [Refund, Escalation],
    "TextOutput": TextOutput(_refund_from_text),
}


@pytest.mark.parametrize("kind", list(OUTPUT_TYPES))
def test_structured_output_is_the_runs_output_as_json(kind, django_user_model):
    pa = Agent(whole_model(), name="lift-out", output_type=OUTPUT_TYPES[kind])

    @pa.tool_plain
    def lift_order(order_id: str) -> dict:
        return {"order_id": order_id, "amount_cents": 2500}

    register_agent(pa)
    run = advance(
        start(
            "lift-out",
            ("lift_order", {"order_id": "O-7"}),
            output={"order_id": "O-7", "amount_cents": 2500},
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_data == {"order_id": "O-7", "amount_cents": 2500}
    # the output tool's call is the run's output, not a step of its own
    assert [s.tool for s in steps(run)] == ["", "lift_order", ""]
    viewer = make_user(django_user_model, "viewer", ["agentruns.view_run"])
    body = ApiClient(viewer).get(f"/api/runs/{run.id}").json()
    assert body["output"] == {"order_id": "O-7", "amount_cents": 2500}


def _refund_for(order_id: str, amount_cents: int) -> Refund:
    """An output function: what the model answers, turned into the run's output."""
    if amount_cents <= 0:
        raise ModelRetry("the amount must be positive")
    return Refund(order_id=order_id.upper(), amount_cents=amount_cents)


def test_an_output_function_runs_and_its_retry_goes_back_to_the_model():
    register_agent(Agent(whole_model(), name="lift-outfn", output_type=_refund_for))
    run = advance(
        start(
            "lift-outfn",
            outputs=[
                {"order_id": "o-8", "amount_cents": 0},
                {"order_id": "o-8", "amount_cents": 900},
            ],
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_data == {"order_id": "O-8", "amount_cents": 900}
    assert len(steps(run)) == 2  # the model was sent back once


# ------------------------------------------------------------------ output validators
def test_an_output_validator_sends_the_model_back_once():
    pa = Agent(whole_model(), name="lift-valid", output_type=Refund)
    validated: list[int] = []

    @pa.output_validator
    def at_most_the_order(output: Refund) -> Refund:
        validated.append(output.amount_cents)
        if output.amount_cents > 5000:
            raise ModelRetry("more than the order's total (5000)")
        return output

    register_agent(pa)
    run = advance(
        start(
            "lift-valid",
            outputs=[
                {"order_id": "O-9", "amount_cents": 9000},
                {"order_id": "O-9", "amount_cents": 5000},
            ],
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output_data == {"order_id": "O-9", "amount_cents": 5000}
    assert [s.kind for s in steps(run)] == ["model", "model"]
    # the second request carried the validator's reason
    assert answers(conversations[-1]) == ["final_result=more than the order's total (5000)"]


# ------------------------------------------------------------------ instructions and settings
@dataclass
class Shop:
    name: str
    max_cents: int


def test_instruction_system_prompt_and_model_settings_functions_see_the_runs_deps():
    pa = Agent(
        whole_model(),
        name="lift-instr",
        deps_type=Shop,
        instructions="Static first.",
        model_settings=lambda ctx: {"temperature": 0.1, "max_tokens": ctx.deps.max_cents},
    )

    @pa.instructions
    def shop_name(ctx: RunContext[Shop]) -> str:
        return f"You serve {ctx.deps.name}."

    @pa.system_prompt
    def limit(ctx: RunContext[Shop]) -> str:
        return f"Never above {ctx.deps.max_cents}."

    @pa.tool
    def lift_shop(ctx: RunContext[Shop]) -> str:
        return ctx.deps.name

    register_agent(pa, deps=lambda run: Shop(name=f"shop {run.input['shop']}", max_cents=77))
    run = start_run(
        "lift-instr",
        {"message": json.dumps({"calls": [["lift_shop", {}]], "output": "ok"}), "shop": "A"},
    ).run
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="lift_shop").result == "shop A"
    assert len(seen) == 2
    for info in seen:
        assert info.instructions == "Static first.\n\nYou serve shop A."
        assert info.model_settings["max_tokens"] == 77
    system = [p.content for p in conversations[0][0].parts if isinstance(p, SystemPromptPart)]
    assert system == ["Never above 77."]


# ------------------------------------------------------------------ validation_context
class Amount(BaseModel):
    cents: int

    @field_validator("cents")
    @classmethod
    def under_the_limit(cls, value: int, info: ValidationInfo) -> int:
        if info.context and value > info.context["limit"]:
            raise ValueError(f"above the limit {info.context['limit']}")
        return value


def test_validation_context_reaches_tool_and_output_validation():
    pa = Agent(
        whole_model(),
        name="lift-vctx",
        output_type=Amount,
        validation_context=lambda ctx: {"limit": 100},
    )

    @pa.tool_plain
    def lift_pay(order_id: str, amount: Amount) -> int:
        return amount.cents

    register_agent(pa)
    run = advance(
        start(
            "lift-vctx",
            ("lift_pay", {"order_id": "O-1", "amount": {"cents": 500}}),
            ("lift_pay", {"order_id": "O-1", "amount": {"cents": 50}}),
            outputs=[{"cents": 300}, {"cents": 30}],
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    pays = list(Step.objects.filter(run=run, tool="lift_pay").order_by("index"))
    assert pays[0].status == StepStatus.FAILED and "above the limit 100" in pays[0].error
    assert pays[1].result == 50
    assert run.output_data == {"cents": 30}


# ------------------------------------------------------------------ prepare, dynamic toolsets
def test_prepare_hides_a_tool_for_this_run_and_the_snapshot_still_holds():
    pa = Agent(whole_model(), name="lift-prep", deps_type=dict)

    async def only_for_vips(ctx: RunContext[dict], tool_def: ToolDefinition):
        return tool_def if ctx.deps.get("vip") else None

    @pa.tool_plain(prepare=only_for_vips)
    def lift_upgrade() -> str:
        return "upgraded"

    @pa.tool_plain
    def lift_plain() -> str:
        return "plain"

    register_agent(pa, deps=lambda run: {"vip": run.input.get("vip", False)})
    vip = advance(
        start_run(
            "lift-prep",
            {"message": json.dumps({"calls": [["lift_upgrade", {}]]}), "vip": True},
        ).run
    )
    assert vip.status == RunStatus.SUCCEEDED, vip.error
    assert {t.name for t in seen[0].function_tools} == {"lift_upgrade", "lift_plain"}
    assert Step.objects.get(run=vip, tool="lift_upgrade").result == "upgraded"
    seen.clear()
    plain = advance(start("lift-prep"))
    assert plain.status == RunStatus.SUCCEEDED, plain.error
    assert {t.name for t in seen[0].function_tools} == {"lift_plain"}


def test_a_prepared_toolset_hides_a_tool_for_this_run():
    """`.prepared()`: its function runs at every step with the run's deps and chooses among the
    toolset's tools (Pydantic AI refuses one that adds or renames a tool)."""
    tools = FunctionToolset()

    @tools.tool_plain
    def lift_refund_fast() -> str:
        return "fast"

    @tools.tool_plain
    def lift_refund_slow() -> str:
        return "slow"

    async def by_tier(ctx: RunContext[dict], defs: list[ToolDefinition]) -> list[ToolDefinition]:
        return [d for d in defs if ctx.deps.get("vip") or d.name != "lift_refund_fast"]

    pa = Agent(
        whole_model(), name="lift-prepared", deps_type=dict, toolsets=[tools.prepared(by_tier)]
    )
    register_agent(pa, deps=lambda run: {"vip": run.input.get("vip", False)})
    message = json.dumps({"calls": [["lift_refund_fast", {}]]})
    vip = advance(start_run("lift-prepared", {"message": message, "vip": True}).run)
    assert vip.status == RunStatus.SUCCEEDED, vip.error
    assert {t.name for t in seen[0].function_tools} == {"lift_refund_fast", "lift_refund_slow"}
    assert Step.objects.get(run=vip, tool="lift_refund_fast").result == "fast"
    seen.clear()
    plain = advance(start("lift-prepared"))
    assert plain.status == RunStatus.SUCCEEDED, plain.error
    assert {t.name for t in seen[0].function_tools} == {"lift_refund_slow"}


def _dynamic_agent(asked: list) -> None:
    """lift-dyn: a toolset function offering lift_tides to coastal runs only."""
    pa = Agent(whole_model(), name="lift-dyn", deps_type=dict)

    def lift_weather(city: str) -> str:
        return f"sunny in {city}"

    def lift_tides(port: str) -> str:
        return f"high tide in {port}"

    @pa.toolset
    def by_region(ctx: RunContext[dict]) -> FunctionToolset:
        asked.append(ctx.deps)
        # registration asks with no run (deps None): every tool it may offer, for the snapshot
        coastal = ctx.deps is None or ctx.deps["coastal"]
        return FunctionToolset([lift_weather, lift_tides] if coastal else [lift_weather])

    register_agent(pa, deps=lambda run: {"coastal": run.input.get("coastal", False)})


def test_a_dynamic_toolset_is_asked_per_run():
    asked: list = []
    _dynamic_agent(asked)
    run = advance(
        start_run(
            "lift-dyn",
            {
                "message": json.dumps({"calls": [["lift_tides", {"port": "Brest"}]]}),
                "coastal": True,
            },
        ).run
    )
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="lift_tides").result == "high tide in Brest", (
        Step.objects.get(run=run, tool="lift_tides").error
    )
    assert {t.name for t in seen[0].function_tools} == {"lift_weather", "lift_tides"}
    seen.clear()
    inland = advance(start_run("lift-dyn", {"message": json.dumps({}), "coastal": False}).run)
    assert inland.status == RunStatus.SUCCEEDED, inland.error
    assert {t.name for t in seen[0].function_tools} == {"lift_weather"}
    assert {"coastal": False} in asked and {"coastal": True} in asked


def test_the_permission_snapshot_bounds_what_prepare_and_dynamic_toolsets_offer(
    django_user_model,
):
    group = Group.objects.create(name="trainees")
    policy = ToolPolicy.objects.create(group=group, other_tools_allowed=True)
    ToolRule.objects.create(policy=policy, tool="lift_tides", allowed=False)
    trainee = make_user(django_user_model, "trainee", ["agentruns.start_run"])
    trainee.groups.add(group)
    _dynamic_agent([])
    message = json.dumps({"calls": [["lift_tides", {"port": "Brest"}]]})
    run = start_run("lift-dyn", {"message": message, "coastal": True}, user=trainee).run
    run = advance(run)
    assert {t.name for t in seen[0].function_tools} == {"lift_weather"}  # not lift_tides
    refused = Step.objects.get(run=run, tool="lift_tides")  # the model asked all the same
    assert refused.status == StepStatus.FAILED and "not allowed" in refused.error
    assert refused.attempts == 0


# ------------------------------------------------------------------ tool_timeout
def test_tool_timeout_cuts_a_slow_async_tool_and_tells_the_model():
    import asyncio

    pa = Agent(whole_model(), name="lift-timeout", tool_timeout=0.2)

    @pa.tool_plain
    async def lift_slow() -> str:
        await asyncio.sleep(5)
        return "too late"

    register_agent(pa)
    run = advance(start("lift-timeout", ("lift_slow", {}), output="gave up"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    slow = Step.objects.get(run=run, tool="lift_slow")
    assert slow.result == {"error": "Timed out after 0.2 seconds.", "retry": True}
    assert "lift_slow=Timed out after 0.2 seconds." in " ".join(answers(conversations[-1]))


# ------------------------------------------------------------------ deferred tools by token
def test_call_deferred_parks_the_run_until_its_token_is_resolved():
    pa = Agent(whole_model(), name="lift-defer")

    @pa.tool_plain
    def lift_background_check(customer: str) -> str:
        raise CallDeferred(metadata={"queue": "checks"})

    register_agent(pa)
    run = advance(start("lift-defer", ("lift_background_check", {"customer": "ann"})))
    assert run.status == RunStatus.WAITING, run.error
    wait = Wait.objects.get(run=run)
    assert wait.status == WaitStatus.PENDING and wait.token
    assert advance(run).status == RunStatus.WAITING  # nobody resolved it: parked again
    resolve_wait(wait.token, {"calls": {"c0": "clean record"}}, by="checks-service")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    check = Step.objects.get(run=run, tool="lift_background_check")
    assert check.result == "clean record"
    assert "lift_background_check=clean record" in " ".join(answers(conversations[-1]))
    assert Wait.objects.filter(run=run).count() == 1
    with pytest.raises(WaitAlreadyResolved, match="checks-service"):  # once, and says by whom
        resolve_wait(wait.token, {"calls": {"c0": "another"}}, by="someone-else")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and check.result == "clean record"


def test_an_external_toolsets_call_waits_for_its_token():
    external = ExternalToolset(
        [
            ToolDefinition(
                name="lift_sign",
                parameters_json_schema={
                    "type": "object",
                    "properties": {"document": {"type": "string"}},
                    "required": ["document"],
                },
            )
        ]
    )
    register_agent(Agent(whole_model(), name="lift-ext", toolsets=[external]))
    run = advance(start("lift-ext", ("lift_sign", {"document": "D-1"}), output="signed"))
    assert run.status == RunStatus.WAITING, run.error
    wait = Wait.objects.get(run=run)
    resolve_wait(wait.token, {"calls": {"c0": {"signed_by": "ann"}}}, by="esign")
    run = advance(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert Step.objects.get(run=run, tool="lift_sign").result == {"signed_by": "ann"}
    assert run.output == "signed"


# ------------------------------------------------------------------ capabilities
def test_a_history_processor_shapes_every_request():
    def without_card_numbers(messages: list[ModelMessage]) -> list[ModelMessage]:
        for message in messages:
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                        part.content = part.content.replace("4111-1111", "[card]")
        return messages

    pa = Agent(whole_model(), name="lift-hist", capabilities=[ProcessHistory(without_card_numbers)])

    @pa.tool_plain
    def lift_card_check(card: str) -> str:
        return f"checked {card}"

    register_agent(pa)
    run = advance(start("lift-hist", ("lift_card_check", {"card": "x"}), output="4111-1111 ok"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert len(conversations) == 2
    for conversation in conversations:
        assert "4111-1111" not in str(conversation[0].parts[0].content)
    assert "[card]" in str(conversations[1][0].parts[0].content)


def test_thinking_sets_the_requests_thinking_setting():
    thinking = FunctionModel(
        function=plays, model_name="thinker", profile=ModelProfile(supports_thinking=True)
    )
    register_agent(Agent(thinking, name="lift-think", capabilities=[Thinking(effort="high")]))
    run = advance(start("lift-think", output="thought"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert seen[0].model_request_parameters.thinking == "high"


def searching(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model with native web search: it searches, then answers from what it found."""
    seen.append(info)
    assert [type(t).__name__ for t in info.model_request_parameters.native_tools] == [
        "WebSearchTool"
    ]
    return ModelResponse(
        parts=[
            NativeToolCallPart("web_search", {"query": "refund law"}, tool_call_id="ws1"),
            NativeToolReturnPart("web_search", [{"title": "14 days"}], tool_call_id="ws1"),
            TextPart("Within 14 days."),
        ]
    )


def test_a_builtin_tool_runs_on_the_models_side_and_is_no_step():
    pa = Agent(
        FunctionModel(function=searching, model_name="searching"),
        name="lift-search",
        capabilities=[WebSearch()],
    )
    register_agent(pa)
    run = advance(start("lift-search"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == "Within 14 days."
    (step,) = steps(run)
    assert step.kind == "model" and "web_search" in step.payload  # replayed with it


def failing(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ModelHTTPError(status_code=400, model_name="primary", body={"error": "bad"})


def test_model_fallback_answers_when_the_first_model_refuses():
    pa = Agent(
        FunctionModel(function=failing, model_name="primary"),
        name="lift-fallback",
        capabilities=[ModelFallback(whole_model("backup"))],
    )

    @pa.tool_plain
    def lift_status(order_id: str) -> str:
        return "shipped"

    register_agent(pa)
    run = advance(start("lift-fallback", ("lift_status", {"order_id": "O-3"}), output="Shipped."))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == "Shipped."
    assert Step.objects.get(run=run, tool="lift_status").result == "shipped"
    assert [s.kind for s in steps(run)] == ["model", "tool", "model"]


def test_hooks_see_and_change_the_calls_of_the_run():
    hooks = Hooks()
    requests: list[int] = []

    @hooks.on.before_model_request
    def count(ctx: RunContext, request_context):
        requests.append(ctx.run_step)
        return request_context

    @hooks.on.after_tool_execute
    def stamp(ctx: RunContext, *, call, tool_def, args, result):
        return {**result, "audited": True}

    pa = Agent(whole_model(), name="lift-hooks", capabilities=[hooks])

    @pa.tool_plain
    def lift_price(sku: str) -> dict:
        return {"sku": sku, "cents": 990}

    register_agent(pa)
    run = advance(start("lift-hooks", ("lift_price", {"sku": "S-1"}), output="990"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert requests == [1, 2]
    assert "'audited': True" in " ".join(answers(conversations[-1]))


@pytest.mark.parametrize("streams", [False, True], ids=["whole", "streamed"])
def test_an_event_stream_handler_sees_the_runs_events(streams):
    kinds: list[str] = []

    async def on_events(ctx: RunContext, events) -> None:
        async for event in events:
            kinds.append(type(event).__name__)

    model = FunctionModel(stream_function=play, model_name="streamer") if streams else whole_model()
    pa = Agent(model, name="lift-events", capabilities=[ProcessEventStream(on_events)])

    @pa.tool_plain
    def lift_ping() -> str:
        return "pong"

    register_agent(pa)
    run = advance(start("lift-events", ("lift_ping", {}), output="ok"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert "FunctionToolCallEvent" in kinds and "FunctionToolResultEvent" in kinds
    if streams:  # the model's own events reach the handler, its text the run's events
        assert "PartStartEvent" in kinds and "FinalResultEvent" in kinds
        deltas = [e.data["text"] for e in events(run, "model.delta")]
        assert "".join(deltas) == run.output and run.output.startswith("Done. lift_ping=pong")


def test_a_sync_tool_past_its_timeout_runs_to_its_end_and_its_result_stands():
    """A `def` tool runs on the run's thread (its connection, its transaction) and is never cut
    mid-way: past its timeout it still runs to its end and the model gets what it did (not a
    "Timed out" for an effect that happened)."""
    import time

    pa = Agent(whole_model(), name="lift-slow-sync")
    finished: list[bool] = []

    @pa.tool_plain(timeout=0.1)
    def lift_slow_sync() -> str:
        time.sleep(0.3)
        finished.append(True)
        return "done late"

    register_agent(pa)
    run = advance(start("lift-slow-sync", ("lift_slow_sync", {}), output="ok"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert finished == [True]
    slow = Step.objects.get(run=run, tool="lift_slow_sync")
    assert slow.result == "done late"
    assert "lift_slow_sync=done late" in " ".join(answers(conversations[-1]))
