"""The durability's backend: every durable operation of the agent's loop, as a unit of the run's
journal (docs/engine-design.md, "The journal").

`StepBackend.execute(operation_id, name, body, cache_key, config)` gets each operation with its
typed id and persisted name (`JournalOperationNamer`: `refund__model.request`,
`refund__function_toolset__refund.call_tool:issue_refund`, ...):

- a model request (`ModelRequestId`): the run's next model step (`model/unit.py`);
- a tool call (`ToolsetCallToolId`, function, MCP or dynamic): the tool step the current model
  step planned for the call's id (`tools/unit.py`);
- anything else (`ToolsetGetToolsId`/`ToolsetGetInstructionsId` discovery, argument validation,
  an event handler, a capability's durable operation, message compaction, a suspended
  response's cancellation, and whatever the union gains): a journal entry, found again by its
  order in the run; executed when it has none, its payload then written with the slice's next
  commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

from pydantic_ai.durable_exec import (
    JournalCallableOperationBackend,
    ModelRequestId,
    ToolsetCallToolId,
)

from agentruns.runtime.engine.journal import journal_unit
from agentruns.runtime.engine.model import unit as model_unit
from agentruns.runtime.engine.slice import current
from agentruns.runtime.engine.tools import unit as tool_unit


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
        state = current()
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
