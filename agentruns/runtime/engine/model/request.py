"""The model request itself, the body of the model unit (`unit.py`): streamed when the model can,
asked whole when it cannot; what a failed request raises (`classified`)."""

from __future__ import annotations

from typing import Any

from pydantic_ai.durable_exec._utils import consume_event_stream
from pydantic_ai.messages import ModelResponse
from pydantic_ai.models import Model
from pydantic_ai.models._request_timeout import open_durable_unit_stream

from agentruns.registry.model_names import pydantic_ai_name
from agentruns.runtime.dispatch import stops
from agentruns.runtime.engine.slice import current_or_none
from agentruns.runtime.providers import ModelError, openai_compatible
from agentruns.runtime.providers.model_errors import model_error
from agentruns.runtime.providers.models import estimated_usage, name_of, streams
from agentruns.runtime.providers.stream_pump import (
    _text,
    deliver_delta,
)


# ------------------------------------------------------------------ inside the unit's body
async def request_model(model: Model, params: Any, ctx: Any, handler: Any = None) -> ModelResponse:
    """The request itself (the unit's body): streamed when the model can, each text delta
    handed to the unit (`deliver_delta`) and every event to the agent's event stream `handler`
    (when the loop asked for a streamed request), else asked whole. A stop of the run cancels
    it (`stops.stoppable`: `TurnStopped`), closing the model's stream."""
    state = current_or_none()
    async with stops.stoppable(state.run.id if state is not None else None):
        if not streams(model):
            response = await model.request(
                params.messages, params.model_settings, params.model_request_parameters
            )
        else:
            async with open_durable_unit_stream(
                model, params.messages, params.model_settings, params.model_request_parameters, ctx
            ) as streamed:
                if handler is None:
                    async for event in streamed:
                        if text := _text(event):
                            await deliver_delta(text)
                else:
                    await consume_event_stream(
                        run_context=ctx, stream=_delivered(streamed), handler=handler
                    )
            response = streamed.get()
    usage_for = getattr(model, "usage_for", None)
    if usage_for is not None:  # the scripted model: the engine's estimate
        response.usage = usage_for(params.messages, response)
    elif not (response.usage.input_tokens or response.usage.output_tokens):
        response.usage = estimated_usage(params.messages, response)  # a server that says none
    return response


async def _delivered(streamed: Any) -> Any:
    async for event in streamed:
        if text := _text(event):
            await deliver_delta(text)
        yield event


def _classified(model: Model, exc: Exception) -> BaseException:
    """What a failed request raises: ModelError (an outage to wait out, or a verdict); a
    configuration error or the scripted model's policy failing, as it is."""
    from pydantic_ai.exceptions import UserError

    from agentruns.runtime.providers.scripted_model import ScriptedModel

    if isinstance(exc, ModelError | UserError) or isinstance(model, ScriptedModel):
        return exc
    name = name_of(model) or ""
    openai = pydantic_ai_name(name).startswith(openai_compatible.PREFIXES) if name else False
    return model_error(exc, openai_compatible.endpoint() if openai else None)
