"""Running the agent's own loop for one slice: `agent.run(...)` on this thread's event loop.

The slice's thread drives its own event loop (`thread_loop()`): the loop serves this one run,
so a unit may block it for its database work (`slice.island`). Sync functions the agent's loop
calls (a `def` tool, a sync instructions function or validator) run inline on this thread
(`Agent.using_thread_executor(INLINE)`), inside the island: a native or `def` tool uses this
thread's database connection and, for a transactional tool, the step's own transaction.

Around the run: `replay_scope()` (replayed units emit no telemetry twice), our waiter for waits
by token (`external_event_scope`), what the scripted model plays (`playing`), and no usage limit
of Pydantic AI's own (the run's stop conditions are the engine's: max steps, budgets, deadline).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from django import db
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.durable_exec import external_event_scope, replay_scope
from pydantic_ai.usage import UsageLimits

from agentruns.registry.pydantic_agents.calls import thread_loop
from agentruns.runtime.conversations import history
from agentruns.runtime.engine import agents
from agentruns.runtime.engine.slice import SliceEnds, SliceState, island, running
from agentruns.runtime.engine.waits import StepWaiter
from agentruns.runtime.providers.scripted_model import Playing, playing
from agentruns.runtime.threads import process_threads

NO_LIMITS = UsageLimits(request_limit=None)


class InlineExecutor(Executor):
    """Runs each submitted function on the spot, on the slice's thread, in the island."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        done: Future = Future()
        try:
            with island():
                done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine as is
            done.set_exception(exc)
        return done


INLINE = InlineExecutor()


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
    if agent.deps is not None:
        with island():
            kwargs["deps"] = agent.deps(run)
    prompt: str | None = agents.prompt(agent, run)
    with island():  # a thread's run: the thread's history, its own message last
        thread_history = history.history_for(run, prompt)
    if thread_history is not None:
        kwargs["message_history"], prompt = thread_history, None
    what = Playing(
        policy=agent.scripted_policy,
        instructions=agent.instructions,
        tool_contents=lambda: agents.tool_contents(state),
    )
    try:
        with (
            running(state),
            replay_scope(),
            external_event_scope(StepWaiter(state)),
            PydanticAgent.using_thread_executor(INLINE),
            playing(what),
        ):
            result = await pa_agent.run(prompt, **kwargs)
        if thread_history is not None:
            with island():
                history.record_answer(run, result)
        return result
    except BaseExceptionGroup as group:
        ends = _ends_in(group)
        if ends is not None:
            raise ends from None
        raise


def run_agent(state: SliceState) -> Any:
    """The agent's loop for this slice, to its end (its result) or a `SliceEnds`."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return thread_loop().run_until_complete(_run(state))
    # this thread runs a loop of its own (a run executed inline from a notebook, or under
    # Playwright's sync API): the slice runs on a thread of its own, which this one waits for
    outcome: Future = Future()

    def slice_thread() -> None:
        try:
            outcome.set_result(thread_loop().run_until_complete(_run(state)))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            outcome.set_exception(exc)
        finally:  # this thread's own database connection ends with it (not left to the GC)
            db.connections.close_all()

    process_threads().start("agentruns-slice", slice_thread).join()
    return outcome.result()
