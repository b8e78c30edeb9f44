"""Model providers: messages + tool schemas in; text deltas, tool calls and usage out."""

from __future__ import annotations

from agentruns.runtime.providers.base import (
    ModelError,
    ModelProvider,
    ModelRequest,
    TextDelta,
    ToolCall,
    Usage,
)


def get_provider(model: str) -> ModelProvider:
    """`scripted` or `openai/<model name>` (DESIGN.md 7)."""
    # each provider is imported when first chosen: the OpenAI SDK alone takes a few hundred ms
    if model == "scripted" or model.startswith("scripted/"):
        from agentruns.runtime.providers.scripted import ScriptedProvider

        return ScriptedProvider()
    if model.startswith("openai/"):
        from agentruns.runtime.providers.openai_provider import OpenAIProvider

        return OpenAIProvider(model.split("/", 1)[1])
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
