"""Every private name of pydantic-ai the engine reaches, with why: the one place to look when a
pydantic-ai release changes them (pyproject.toml pins the minor versions CI tests).

Imported here, used elsewhere in the engine:

- `durable_exec._operation_backend.in_durable_unit`: whether the code runs inside a durable
  unit's body. The engine's toolset wrapper and capability must pass a call made from inside a
  unit straight through (a unit is never journaled twice); pydantic-ai's own engines ask the same
  function. (2.78 also offers it as `BaseDurabilityCapability.in_durable_unit`.)
- `durable_exec._toolset.wrap_tool_call_result` / `unwrap_tool_call_result`: a tool call's
  outcome as data (`CallToolResult`, a public type) and back. A tool step records the call's
  control flow (`ModelRetry`, a denial, a deferral) as its payload, exactly as pydantic-ai's
  engines journal it, so a replay raises what the call raised.
- `durable_exec._utils.consume_event_stream`: an agent's own `event_stream_handler` consumes the
  model's live stream inside the model unit, as pydantic-ai's engines do (the handler's events
  are never replayed).
- `models._request_timeout.open_durable_unit_stream`: a streamed request under the model's
  first-event deadline (`request_timeout`) from inside a unit, which pydantic-ai's loop cannot
  see.

Protected hooks of `BaseDurabilityCapability` the engine's capability overrides (durability.py):
`_bind_models` (an agent declared without a model: each run names one), `_bind_to_agent` (our
backend per agent), `_toolset_in_durable_context` (calls from inside a unit pass through),
`_wrap_and_register_leaf` (a dynamic toolset without an id is not wrapped), `_registered_model_id`
(models the engine builds by name are known by that name), `_model_request_operation` and
`_model_request_stream_operation` (the request streams its text into the run's events). These
are the hooks pydantic-ai's own engines (DBOS, Temporal, Prefect) override.

And two fields of the graph's state and deps (`_agent_graph.GraphAgentState.run_step`,
`GraphAgentDeps.prompt`), reached through the public `AgentRun.ctx` (`start_at`): a loop started
from a resume point's history with no new prompt (resume.py) starts counting steps at 0 and reports
no prompt; told both before its first node, its instructions and tools see what the loop that
made the history saw.

And one attribute: a combined toolset's tool carries its source tool as `source_tool`
(durability.py reads it to know whether a function tool is sync).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.durable_exec._operation_backend import in_durable_unit
from pydantic_ai.durable_exec._toolset import unwrap_tool_call_result, wrap_tool_call_result
from pydantic_ai.durable_exec._utils import consume_event_stream
from pydantic_ai.models._request_timeout import open_durable_unit_stream


def start_at(agent_run: Any, *, prompt: Any, run_step: int) -> None:
    """The loop `agent_run` (not started yet) goes on from step `run_step` of a run whose prompt
    was `prompt`."""
    graph = agent_run.ctx
    graph.deps.prompt = prompt
    graph.state.run_step = run_step


__all__ = [
    "consume_event_stream",
    "in_durable_unit",
    "open_durable_unit_stream",
    "start_at",
    "unwrap_tool_call_result",
    "wrap_tool_call_result",
]
