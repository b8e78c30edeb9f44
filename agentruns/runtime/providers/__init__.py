"""Model providers: messages + tool schemas in; text deltas, tool calls and usage out."""

from __future__ import annotations

from typing import Any

from agentruns.runtime.providers.base import (
    ModelError,
    ModelProvider,
    ModelRequest,
    TextDelta,
    TextSink,
    ToolCall,
    Usage,
)


def get_provider(model: str, agent: Any = None) -> ModelProvider:
    """`scripted`, `openai/<model name>`, any Pydantic AI model name (`openai:gpt-4o`,
    `anthropic:...`; DESIGN.md 7, registry/model_names.py), or a Pydantic AI agent's own model
    instance. Every model but the scripted one goes through Pydantic AI."""
    instance = getattr(agent, "model_instance", None)
    if instance is not None and model == agent.model:
        from agentruns.runtime.providers.pydantic_ai_models import PydanticAIProvider

        return PydanticAIProvider(instance, agent.model_settings)
    # each provider is imported when first chosen: Pydantic AI and the OpenAI SDK take a few
    # hundred ms, which a process serving only the scripted model never pays
    if model == "scripted" or model.startswith("scripted/"):
        from agentruns.runtime.providers.scripted import ScriptedProvider

        return ScriptedProvider()
    # "test": Pydantic AI's TestModel (calls every tool)
    if model.startswith("openai/") or ":" in model or model == "test":
        from agentruns.runtime.providers.pydantic_ai_models import PydanticAIProvider

        return PydanticAIProvider(model, getattr(agent, "model_settings", None))
    raise ModelError(f"unknown model provider {model!r}", retryable=False)


__all__ = [
    "ModelError",
    "ModelProvider",
    "ModelRequest",
    "TextDelta",
    "TextSink",
    "ToolCall",
    "Usage",
    "get_provider",
]
