"""A model request's rate-limit slot (AGENTRUNS_MODEL_LIMITS; runtime/access/model_limits.py),
kept before each attempt of the model unit: the request goes at its slot, the run backs off
without a thread when the slot is far off, and a cancel read while it waits ends the slice."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import ModelMessagesTypeAdapter
from pydantic_ai.models import Model

from agentruns.conf import conf
from agentruns.registry.model_names import pydantic_ai_name
from agentruns.runtime.access import model_limits
from agentruns.runtime.engine import journal
from agentruns.runtime.engine.journal import BackingOff, Cancelled
from agentruns.runtime.providers import openai_compatible
from agentruns.runtime.providers.base import NOT_BEFORE
from agentruns.runtime.providers.models import name_of


async def wait_for_slot(state: Any, model: Model, params: Any) -> None:
    """Returns once the request may go (its slot has come: `NOT_BEFORE` is set for the wire);
    raises the slice's end when the run backs off for its slot or is cancelled meanwhile."""
    NOT_BEFORE.set(None)
    if (state.run.model or conf.MODEL) not in conf.MODEL_LIMITS:
        return
    slot = await state.lane.run(
        model_limits.slot_for,
        state,
        lambda: _prompt_chars(params),
        in_worker=state.drain is not None,
    )
    if slot is None:
        return
    if slot.back_off_until is not None:
        raise await journal.ended(state, BackingOff(slot.back_off_until, slot.event))
    if slot.due - time.time() > 1.0:
        if not await journal.wait_for_retry(state, datetime.fromtimestamp(slot.due - 1.0, UTC)):
            raise await journal.ended(state, Cancelled())
    start = model_limits.slot_start(slot.due, precise_start=_waits_at_the_wire(model))
    await asyncio.sleep(max(0.0, start - time.time()))
    NOT_BEFORE.set(slot.due)


def _prompt_chars(params: Any) -> int:
    """The request's messages and tool declarations as JSON, in characters."""
    tools = params.model_request_parameters.function_tools
    declared = sum(len(str(t.parameters_json_schema)) + len(t.description or "") for t in tools)
    return len(ModelMessagesTypeAdapter.dump_json(params.messages)) + declared


def _waits_at_the_wire(model: Model) -> bool:
    """The OpenAI-compatible client holds a request until its slot (`_SlottedWire`)."""
    name = name_of(model)
    return bool(name) and pydantic_ai_name(name).startswith(openai_compatible.PREFIXES)
