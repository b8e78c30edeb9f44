"""Model providers: messages + tool schemas in; text deltas, tool calls and usage out."""

from __future__ import annotations

from typing import Any

from agentruns.runtime.providers.base import (
    ModelError,
    ModelProvider,
    ModelRequest,
    TextDelta,
    ToolCall,
    Usage,
)


def get_provider(model: str, agent: Any = None) -> ModelProvider:
    """`scripted`, `openai/<model name>`, any Pydantic AI model name (`openai:gpt-4o`,
    `anthropic:...`; DESIGN.md 7), or a Pydantic AI agent's own model instance."""
    instance = getattr(agent, "model_instance", None)
    if instance is not None and model == agent.model:
        from agentruns.runtime.providers.pydantic_ai_models import PydanticAIProvider

        return PydanticAIProvider(instance, agent.model_settings)
    # each provider is imported when first chosen: the OpenAI SDK alone takes a few hundred ms
    if model == "scripted" or model.startswith("scripted/"):
        from agentruns.runtime.providers.scripted import ScriptedProvider

        return ScriptedProvider()
    if model.startswith("openai/"):
        from agentruns.runtime.providers.openai_provider import OpenAIProvider

        return OpenAIProvider(model.split("/", 1)[1])
    if ":" in model or model == "test":  # "test": Pydantic AI's TestModel (calls every tool)
        from agentruns.runtime.providers.pydantic_ai_models import PydanticAIProvider

        return PydanticAIProvider(model, getattr(agent, "model_settings", None))
    raise ModelError(f"unknown model provider {model!r}", retryable=False)


__all__ = [
    "ModelError",
    "ModelProvider",
    "ModelRequest",
    "TextDelta",
    "ToolCall",
    "Usage",
    "get_provider",
]
