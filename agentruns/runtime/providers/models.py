"""Model names -> Pydantic AI models, one instance per name and process.

`AGENTRUNS_MODEL` (or an agent's own model, or a run's) may be `scripted` (the offline default,
`scripted_model.py`), `openai/<name>` for any OpenAI-compatible endpoint, or any Pydantic AI
model name (`openai:gpt-4o`, `anthropic:...`, `google-gla:...`, `ollama:...`;
registry/model_names.py). A model is built once per process and name: its HTTP client lives on
the process's run loop (engine/lanes.py), where every run's requests run.

`streams(model)`: whether a request is streamed (deltas as they come) or asked whole
(`Model.request`): a model that never keeps the run waiting (the scripted one without delay) or
that cannot stream (a `FunctionModel` without a `stream_function`) is asked whole, and its
text is the attempt's one delta.
"""

from __future__ import annotations

import json
import threading

from django.core.signals import setting_changed
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model, infer_model
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.usage import RequestUsage

from agentruns.registry.model_names import pydantic_ai_name
from agentruns.runtime.providers import openai_compatible
from agentruns.runtime.providers.base import ModelError
from agentruns.runtime.providers.scripted_model import (
    ScriptedModel,
    estimate_tokens,
    scripted_model,
)

_built: dict[str, Model] = {}
_lock = threading.Lock()


def _forget(**_: object) -> None:
    """Settings changed (tests do, at run time): models are built again from the new ones."""
    with _lock:
        _built.clear()


setting_changed.connect(_forget, dispatch_uid="agentruns.providers.models")


def is_scripted(name: str) -> bool:
    return name == "scripted" or name.startswith("scripted/")


def build_model(name: str) -> Model:
    """A new Pydantic AI model for a model name; ModelError (fatal) when it cannot be built (an
    SDK extra, a key or a base URL missing: registration and start-up refuse the first already)."""
    resolved = pydantic_ai_name(name)
    try:
        if resolved.startswith(openai_compatible.PREFIXES):
            return openai_compatible.openai_model(resolved)
        return infer_model(resolved)
    except Exception as exc:  # unknown provider, missing SDK or key
        raise ModelError(f"cannot use model {name!r}: {exc}", retryable=False) from exc


def model_for(name: str) -> Model:
    """The process's model for `name` (built on first use)."""
    if is_scripted(name):
        return scripted_model()
    with _lock:
        model = _built.get(name)
    if model is None:
        model = build_model(name)
        with _lock:
            model = _built.setdefault(name, model)
    return model


def name_of(model: Model) -> str | None:
    """The name this process built `model` for (None: not one of ours)."""
    if isinstance(model, ScriptedModel):
        return "scripted"
    with _lock:
        return next((name for name, built in _built.items() if built is model), None)


def _unwrapped(model: Model) -> Model:
    while isinstance(model, WrapperModel):
        model = model.wrapped
    return model


def streams(model: Model) -> bool:
    inner = _unwrapped(model)
    if isinstance(inner, ScriptedModel):
        return inner.waits
    if isinstance(inner, FunctionModel):
        return inner.stream_function is not None
    return not isinstance(inner, TestModel)


def waits(model: Model) -> bool:
    """The request keeps the run waiting (give the database connection back meanwhile)."""
    inner = _unwrapped(model)
    if isinstance(inner, ScriptedModel):
        return inner.waits
    return not isinstance(inner, TestModel)


def _part_text(part: object) -> str:
    if isinstance(part, ToolCallPart):
        return part.args if isinstance(part.args, str) else json.dumps(part.args or {})
    content = getattr(part, "content", "")
    return content if isinstance(content, str) else json.dumps(content, default=str)


def estimated_usage(messages: list[ModelMessage], response: ModelResponse) -> RequestUsage:
    """The usage of a request whose server reported none (characters / 4 of the conversation
    and of the answer), so the run's token and cost budgets still count it."""
    prompt = 0
    for message in messages:
        text = getattr(message, "instructions", None) or ""
        text += "".join(_part_text(part) for part in message.parts)
        prompt += estimate_tokens(text) if text else 0
    answer = "".join(
        _part_text(part) for part in response.parts if isinstance(part, TextPart | ToolCallPart)
    )
    return RequestUsage(input_tokens=prompt, output_tokens=estimate_tokens(answer))
