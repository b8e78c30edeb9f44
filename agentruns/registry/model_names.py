"""What a model name means, and whether this install can speak it (DESIGN.md 7).

`AGENTRUNS_MODEL` and an agent's own `model` take `scripted` (offline), `test` (Pydantic AI's
TestModel), `openai/<name>` (kept from before: the same as `openai:<name>`) or any Pydantic AI
model name `<provider>:<name>` (`openai:`, `anthropic:`, `google:`/`google-gla:`, `groq:`,
`mistral:`, `bedrock:`, `ollama:`, ...). Each provider's SDK is a `pydantic-ai-slim` extra; one
that is not installed is refused when the agent registers and when a process starts
(`check_model_name`), with the pip command that installs it, never mid-run.
"""

from __future__ import annotations

# Pydantic AI 1.x names, still in docs and habits, for the 2.x provider names
PROVIDER_ALIASES = {"google-gla": "google", "google-vertex": "google-cloud"}
# names that need no Pydantic AI provider
OFFLINE = ("scripted", "test")


class UnusableModel(ValueError):
    """A model name this install cannot use (unknown provider, or its SDK extra is missing)."""


def pydantic_ai_name(name: str) -> str:
    """The Pydantic AI model name for one of ours: `openai/x` -> `openai:x`, aliases resolved."""
    if name.startswith("openai/"):
        return "openai:" + name.split("/", 1)[1]
    provider, sep, rest = name.partition(":")
    if sep and provider in PROVIDER_ALIASES:
        return f"{PROVIDER_ALIASES[provider]}:{rest}"
    return name


def check_model_name(name: str | None) -> None:
    """Raise UnusableModel unless `name` is a model this process can build (keys are not
    checked here: they belong to the environment a worker runs in)."""
    if not name or name in OFFLINE or name.startswith("scripted/"):
        return
    resolved = pydantic_ai_name(name)
    provider, sep, model = resolved.partition(":")
    if not sep or not provider or not model:
        raise UnusableModel(
            f"model {name!r}: expected `scripted`, `openai/<model>` or a Pydantic AI model name "
            "`<provider>:<model>` (openai:, anthropic:, google:, groq:, mistral:, bedrock:, "
            "ollama:, ...)"
        )
    try:
        # importing the provider imports its SDK: the one thing an install may lack
        from pydantic_ai.providers import infer_provider_class
    except ImportError as exc:
        raise UnusableModel(
            f'model {name!r} needs Pydantic AI: pip install "pydantic-ai-slim[openai]" ({exc})'
        ) from None
    try:
        infer_provider_class(provider)
    except ImportError as exc:  # Pydantic AI's message names the extra to install
        raise UnusableModel(f"model {name!r}: {exc}") from None
    except ValueError:
        raise UnusableModel(
            f"model {name!r}: Pydantic AI knows no model provider {provider!r}"
        ) from None
