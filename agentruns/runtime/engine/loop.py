"""Running the agent's own loop for one slice: `agent.run(...)` as a task of an event loop.

In a worker the task runs on the process's one event loop beside every other run of the process
(`workers/pool.py`); a run advanced in the calling thread gets a loop of its own
(`executor.advance`). Nothing blocking runs on the loop: the slice's blocking work goes to its
lane (`lanes.py`), and so do the sync functions the agent's loop calls (a `def` tool, a sync
instructions function or validator: `Agent.using_thread_executor(LANES)`), so a native or `def`
tool uses the lane's database connection and, for a transactional tool, the step's own
transaction.

Around the run: `replay_scope()` (replayed units emit no telemetry twice), our waiter for waits
by token (`external_event_scope`), what the scripted model plays (`playing`), and no usage limit
of Pydantic AI's own (the run's stop conditions are the engine's: max steps, budgets, deadline).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.durable_exec import external_event_scope, replay_scope
from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import UsageLimits

from agentruns.runtime.conversations import history
from agentruns.runtime.engine import agents, resume
from agentruns.runtime.engine.lanes import LaneExecutor
from agentruns.runtime.engine.pydantic_ai_private import start_at
from agentruns.runtime.engine.slice import SliceEnds, SliceState, current_lane, running
from agentruns.runtime.engine.waits import StepWaiter
from agentruns.runtime.providers.scripted_model import Playing, playing

NO_LIMITS = UsageLimits(request_limit=None)


LANES = LaneExecutor(current_lane)


def _ends_in(group: BaseException) -> SliceEnds | None:
    """A SliceEnds raised inside a task group (parallel tool calls) comes out wrapped."""
    if isinstance(group, SliceEnds):
        return group
    if isinstance(group, BaseExceptionGroup):
        for inner in group.exceptions:
            if (found := _ends_in(inner)) is not None:
                return found
    return None


async def _run(state: SliceState) -> Any:
    agent = state.agent
    pa_agent, durability = agents.prepared(agent)
    run = state.run
    kwargs: dict[str, Any] = {"usage_limits": NO_LIMITS, "capabilities": [durability]}
    model = agents.model_selection(agent, run)
    if model is not None:
        kwargs["model"] = model
    lane = state.lane
    if agent.deps is not None:
        kwargs["deps"] = await lane.run(agent.deps, run)
    prompt: str | None = agents.prompt(agent, run)
    if state.resume is not None:  # where a slice before stored it: only what came after replays
        kwargs["message_history"], kwargs["usage"] = resume.history(state.resume)
    elif run.thread_id is not None:  # a thread's run: the thread's history, its own message last
        thread_history = await lane.run(history.history_for, run, prompt)
        if thread_history is not None:
            kwargs["message_history"], prompt = thread_history, None
            state.thread_turn = True
    what = Playing(
        policy=agent.scripted_policy,
        instructions=agent.instructions,
        tool_content=lambda call_id: agents.tool_content(state, call_id),
    )
    with (
        running(state),
        replay_scope(),
        external_event_scope(StepWaiter(state)),
        PydanticAgent.using_thread_executor(LANES),
        playing(what),
    ):
        if state.resume is None:
            result = await pa_agent.run(prompt, **kwargs)
        else:
            result = await _resumed(pa_agent, prompt, state.resume.run_step, kwargs)
    if state.thread_turn:  # the thread gets the run's own messages
        answer = result.new_messages() if state.resume is None else _own(result, state)
        await lane.run(history.record_answer, run, answer, result.usage)
    return result


async def _resumed(pa_agent: Any, prompt: str | None, run_step: int, kwargs: dict) -> Any:
    """`agent.run()` from a resume point's history: the loop, node by node as `run()` drives it,
    told the run's prompt and step number before its first node (resume.py)."""
    async with pa_agent.iter(None, **kwargs) as agent_run:
        start_at(agent_run, prompt=prompt, run_step=run_step)
        node = agent_run.next_node
        while not pa_agent.is_end_node(node) and agent_run.result is None:
            node = await agent_run.next(node)
    assert agent_run.result is not None, "the agent's loop did not finish"
    return agent_run.result


def _own(result: Any, state: SliceState) -> list[Any]:
    """A resumed thread run's own messages: from the first answer of its own model steps (the
    loop's history also holds the thread's earlier turns, and the resumed slice's "new" messages
    are only those after its resume point)."""
    messages = result.all_messages()
    answers = [i for i, message in enumerate(messages) if isinstance(message, ModelResponse)]
    first = len(answers) - len(state.model_steps)
    return messages[answers[first] :] if 0 <= first < len(answers) else []


async def run_agent(state: SliceState) -> Any:
    """The agent's loop for this slice, to its end (its result) or a `SliceEnds`."""
    try:
        return await _run(state)
    except BaseExceptionGroup as group:
        ends = _ends_in(group)
        if ends is not None:
            raise ends from None
        raise
