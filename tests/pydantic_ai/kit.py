"""Helpers of the Pydantic AI tests: start a run of a test agent with a plan for its model."""

from __future__ import annotations

import json

from agentruns.models import Run
from agentruns.services import start_run


def plan(*calls: tuple[str, dict], say: str = "Done.", **extra: object) -> str:
    """The message the test agents' FunctionModel plays (tests/pydantic_ai/agents.py)."""
    return json.dumps({"calls": [list(c) for c in calls], "say": say, **extra})


def start(agent: str, *calls: tuple[str, dict], user=None, say: str = "Done.", **extra) -> Run:
    return start_run(agent, {"message": plan(*calls, say=say, **extra)}, user=user).run
