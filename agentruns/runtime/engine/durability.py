"""Our durability capability: the agent's own Pydantic AI loop, with every I/O a Step.

`AgentRunsDurability` is a `BaseDurabilityCapability` (pydantic-ai's public `durable_exec`
surface, as `DBOSDurability` is): it declares the engine (a JSON journal in PostgreSQL, every
toolset kind wrapped, tool calls in order) and hands every durable operation to `StepBackend`
(below). Inside a run's slice it also applies the engine's own rules to the loop:

- the model is offered only the tools the run's permission snapshot allows (`prepare_tools`);
- a call the engine refused when it planned it (unknown, outside the snapshot, bad JSON or
  arguments) goes back to the model with the planned error (`wrap_tool_validate`);
- an approval rule that holds parks the call in our inbox (`wrap_tool_execute` defers it,
  `handle_deferred_tool_calls` waits on the inbox: waits.py), unless the call's operation key
  is used (it is answered "already done" without asking anybody); an approved call runs only
  with the exact arguments its final approval approved;
- a model request streams its text to the run's events when the model can stream, and is one
  whole response when it cannot (`_model_request_operation`);
- every tool call of the loop, whatever toolset its tool is in, is its step's unit
  (`StepsToolset`, the run's toolset: `get_wrapper_toolset`).

Its backend (`StepBackend.execute(operation_id, name, body, cache_key, config)`) gets each
durable operation with its typed id and persisted name (`JournalOperationNamer`:
`refund__model.request`, `refund__function_toolset__refund.call_tool:issue_refund`, ...): a
model request (`ModelRequestId`) is the run's next model step (`model/unit.py`); a tool call
(`ToolsetCallToolId`, function, MCP or dynamic) the tool step the current model step planned for
the call's id (`tools/unit.py`); anything else (discovery, argument validation, an event
handler, a capability's durable operation, message compaction, a suspended response's
cancellation, and whatever the union gains) a journal entry, found again by its order in the
run (`journal.journal_unit`).
Outside a run's slice it is transparent.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from pydantic_ai.capabilities.abstract import AbstractCapability
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallToolResult,
    DurabilityEngineSpec,
    JournalCallableOperationBackend,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
    durable_unit_scope,
)
from pydantic_ai.exceptions import ApprovalRequired, ModelRetry
from pydantic_ai.messages import ModelResponse
from pydantic_ai.models import Model
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, RunContext, ToolDefinition
from pydantic_ai.toolsets import WrapperToolset
from pydantic_ai.toolsets.function import FunctionToolsetTool

from agentruns.models import Step, StepStatus
from agentruns.registry import UnknownTool, get_tool
from agentruns.registry.pydantic_agents.calls import classified
from agentruns.runtime.access.permissions import needs_approval
from agentruns.runtime.engine import slice as slices
from agentruns.runtime.engine.journal import journal_unit
from agentruns.runtime.engine.model import unit as model_unit
from agentruns.runtime.engine.plan import refuse_planned
from agentruns.runtime.engine.pydantic_ai_private import (
    in_durable_unit,
    unwrap_tool_call_result,
    wrap_tool_call_result,
)
from agentruns.runtime.engine.tools import unit as tool_unit
from agentruns.runtime.engine.tools.toolsets import registered_tools
from agentruns.runtime.engine.waits import ask_for, decide_deferred, rule_decided, rule_wait
from agentruns.runtime.operations.gate import answered_already
from agentruns.runtime.providers.models import model_for, name_of


class StepBackend(JournalCallableOperationBackend[Any]):
    async def execute(
        self,
        *,
        operation_id: Any,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: Any,
    ) -> object:
        state = slices.current()
        match operation_id:
            case ModelRequestId(model_id=model_id):
                # cache_key: (model id, messages, settings, request parameters, run context)
                params = SimpleNamespace(
                    messages=cache_key[1],
                    model_request_parameters=cache_key[3],
                    run_context=cache_key[4] if len(cache_key) > 4 else None,
                )
                return await model_unit.execute(state, model_id, body, params)
            case ToolsetCallToolId(toolset_kind=kind):
                # cache_key: (tool name, arguments, run context, tool or tool definition)
                ctx = cache_key[2]
                return await tool_unit.execute(state, kind, str(cache_key[0]), ctx, body)
            case _:
                return await journal_unit(state, name, body)


ENGINE = DurabilityEngineSpec(
    engine_name="agentruns",
    durable_unit_noun="step",
    durable_unit_plural="steps",
    durable_container_noun="run",
    codec=JSON_CODEC,
    # a tool call is a unit of our own, whatever its toolset (`StepsToolset`, below); an MCP
    # server's tools are those listed when its agent registered (`RegisteredTools`); a dynamic
    # toolset is wrapped, so its listing is a journaled unit
    wrapped_toolset_kinds=frozenset({"dynamic"}),
    toolset_lifecycles={"dynamic": "enter-never"},
    journal_discovery=True,
    sequential_tools_in_durable_context=True,
    tool_config_key=None,
)


# a tool step whose outcome is recorded: its unit replays it
_SETTLED = frozenset({StepStatus.SUCCEEDED, StepStatus.REJECTED, StepStatus.SKIPPED})


class AgentRunsDurability(BaseDurabilityCapability[Any]):
    engine_spec = ENGINE

    def __init__(self, *, name: str | None = None, models: dict[str, Model] | None = None) -> None:
        super().__init__(name=name, models=models)
        self._backend: StepBackend | None = None

    def for_agent(self, agent: Any) -> AbstractCapability[Any]:
        # bound once per agent (engine/agents.py) and handed to each of its runs as it is
        if self._agent is agent:
            return self
        return super().for_agent(agent)

    def _bind_models(self, agent: Any) -> None:
        """An agent declared without a model of its own: each run names one (`agents.py`)."""
        if agent.model is None:
            self._default_model_id, self._models_by_id = None, dict(self._extra_models)
            return
        super()._bind_models(agent)

    def _bind_to_agent(self, agent: Any) -> None:
        self._backend = StepBackend(
            agent_name=self.name,
            config=RoleBasedOperationConfig(model=None, event=None, capability=None, tool=None),
        )
        super()._bind_to_agent(agent)

    def get_durable_operation_backend(self) -> StepBackend:
        assert self._backend is not None, "bound to an agent first (for_agent)"
        return self._backend

    @property
    def in_durable_context(self) -> bool:
        return slices.current_or_none() is not None

    def _toolset_in_durable_context(self) -> bool:
        # inside a tool call's unit the toolset is called directly (the unit journals the call)
        return self.in_durable_context and not in_durable_unit()

    def _wrap_and_register_leaf(self, ts: Any) -> Any:
        """A dynamic toolset without an `id` (which would name the units of its listing) is
        not wrapped: its calls are units all the same, its listing is asked again on replay."""
        if getattr(ts, "_explicit_id", None) is None:
            return ts
        return super()._wrap_and_register_leaf(ts)

    def get_wrapper_toolset(self, toolset: Any) -> Any:
        """The run's toolset: MCP servers' tools as registered, every call a unit."""
        wrapped = super().get_wrapper_toolset(toolset)
        if not self.in_durable_context:
            return wrapped
        return StepsToolset((wrapped or toolset).visit_and_replace(registered_tools))

    # ------------------------------------------------------------ the run's identity and model
    def get_default_run_id(self) -> str | None:
        state = slices.current_or_none()
        return str(state.run.id) if state is not None else None

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def resolve_model_id(self, ctx: Any, *, model_id: str) -> Model | None:
        """A model name of this engine (`scripted`, `openai/...`, any Pydantic AI name) as the
        process's instance of it, on the loop side and in the model unit alike."""
        found = await super().resolve_model_id(ctx, model_id=model_id)
        return found if found is not None else model_for(model_id)

    def _registered_model_id(self, model: Model) -> tuple[bool, str | None]:
        """A model this process built for a name is known by that name on both sides of a unit
        (and is not the unit's to enter and close: it lives on for the process's next run)."""
        registered, model_id = super()._registered_model_id(model)
        if registered:
            return registered, model_id
        name = name_of(model)
        return (True, name) if name is not None else (False, None)

    async def _model_request_operation(self, params: Any) -> ModelResponse:
        """One model request, streamed when the model can (its text to the run's events as it
        comes), else asked whole."""
        async with self._durable_model_scope(params.model_id, params.run_context, serving=True) as (
            model,
            durable_ctx,
        ):
            response = await model_unit.request_model(model, params, durable_ctx)
        self._stamp_response(response, params.messages)
        return response

    async def _model_request_stream_operation(self, params: Any) -> ModelResponse:
        """A streamed request (the loop asks for one when the agent has an event stream
        handler): the handler gets the model's events inside the unit, its text goes to the run's
        events; a model that cannot stream is asked whole (its handler sees no model events)."""
        async with self._durable_model_scope(params.model_id, params.run_context, serving=True) as (
            model,
            durable_ctx,
        ):
            response = await model_unit.request_model(
                model, params, durable_ctx, handler=self._model_stream_event_handler()
            )
        self._stamp_response(response, params.messages)
        return response

    # ------------------------------------------------------------ the engine's rules
    async def prepare_tools(
        self, ctx: RunContext[Any], tool_defs: list[ToolDefinition]
    ) -> list[ToolDefinition]:
        state = slices.current_or_none()
        if state is None:
            return tool_defs
        allowed = set(state.run.allowed_tools)
        return [tool_def for tool_def in tool_defs if tool_def.name in allowed]

    async def wrap_tool_validate(
        self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        state, step = _slice_and_step(call)
        if step is None:
            return await handler(args)
        if step.status == StepStatus.FAILED and not step.attempts:
            raise ModelRetry(step.error)  # refused when planned: the model is told why
        # the arguments the step recorded when it was planned (checked, their text repaired)
        # are the ones that run, as the model's or as a person approved them
        return await handler(step.arguments if step.status == StepStatus.PENDING else args)

    async def on_tool_validate_error(
        self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: Any, error: Any
    ) -> Any:
        """The tool's own validation refused arguments the engine's schema accepted: the step
        fails as a bad call does (its error back to the model)."""
        state, step = _slice_and_step(call)
        if step is not None and step.status == StepStatus.PENDING and not step.attempts:
            await state.lane.run(refuse_planned, state, step, str(error))
        raise error

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: Any, tool_def: Any, args: Any, handler: Any
    ) -> Any:
        state, step = _slice_and_step(call)
        if step is None:
            return await handler(args)
        if ctx.tool_call_approved:
            return await handler(args)
        if rule_wait(state, step.call_id) is not None:
            await rule_decided(state, step)  # (parks while nobody decided)
            return await handler(args)  # as approved (the arguments validated), or the denial
        if state.awaited_approval(step.call_id):
            raise ApprovalRequired()  # the tool asked itself: Pydantic AI's deferral replays it
        if step.status in _SETTLED:
            # its outcome is recorded and no wait of this run asked about it (a fork's history,
            # a call no rule held): it is replayed, never put before a person again
            return await handler(args)
        try:
            tool = get_tool(step.tool)
        except UnknownTool:  # the unit refuses it (not deployed any more)
            return await handler(args)
        # a predicate of the tool's own may read the database: on the lane; and a call whose
        # operation key is used is answered "already done" without a person
        held = (
            await state.lane.run(needs_approval, state.run, tool, step.arguments)
            if callable(tool.requires_approval)
            else needs_approval(state.run, tool, step.arguments)
        ) and not await state.lane.run(answered_already, state.run, tool, step.arguments)
        if held:
            raise await ask_for(state, step)
        return await handler(args)

    async def handle_deferred_tool_calls(
        self, ctx: RunContext[Any], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        state = slices.current_or_none()
        if state is None:
            return None
        return await decide_deferred(state, ctx, requests)


def _slice_and_step(call: Any) -> tuple[Any, Step | None]:
    """The slice in progress (None: not in a run) and the step it planned for `call`."""
    state = slices.current_or_none()
    return state, state.step_for_call(call.tool_call_id) if state is not None else None


# ---------------------------------------------------------------- the run's toolset
class StepsToolset(WrapperToolset[Any]):
    """Around the run's toolset (our durability's `get_wrapper_toolset`): a tool call of the
    agent's loop is its step's unit, whatever toolset the tool is in. The call itself is the
    unit's body, its outcome recorded as Pydantic AI's `CallToolResult` (control flow as data)
    and given back to the loop as the toolset's answer."""

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        state = slices.current_or_none()
        if state is None or in_durable_unit():
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)

        tool = _uncut(tool)

        async def body() -> Any:
            with durable_unit_scope():
                call = self.wrapped.call_tool(name, tool_args, ctx, tool)
                result = await wrap_tool_call_result(
                    classified(name, call, rerun_safe=_rerun_safe(name))
                )
                return JSON_CODEC.dump(CallToolResult, result)

        payload = await tool_unit.execute(state, "call", name, ctx, body)
        return unwrap_tool_call_result(JSON_CODEC.load(CallToolResult, payload))


def _uncut(tool: Any) -> Any:
    """A sync function tool runs to its end whatever its timeout: its thread cannot be stopped,
    so a timeout would tell the model "timed out" about an effect that happened. (A combined
    toolset's tool carries the function toolset's as `source_tool`, and hands its own
    `tool_def` down.)"""
    leaf = tool
    while (inner := getattr(leaf, "source_tool", None)) is not None:
        leaf = inner
    if isinstance(leaf, FunctionToolsetTool) and not leaf.is_async:
        if tool.tool_def.timeout != math.inf:
            return replace(tool, tool_def=replace(tool.tool_def, timeout=math.inf))
    return tool


def _rerun_safe(name: str) -> bool:
    """A broken connection may be retried: the tool is read-only or idempotent."""
    try:
        tool = get_tool(name)
    except UnknownTool:
        return False
    return not tool.side_effect or tool.idempotency == "key"
