"""The provider tests' constants and their one agent of their own, registered like any app's."""

from __future__ import annotations

from agentruns.registry import Agent, register_agent

API_KEY = "sk-test-abcdefghijklmnop1234"
MODEL = "openai/fake-model"

# an agent that pins its own model, whatever AGENTRUNS_MODEL says
register_agent(
    Agent(
        name="openai-pinned",
        instructions="Be brief.",
        tools=["t_echo"],
        model="openai/pinned-model",
    )
)
