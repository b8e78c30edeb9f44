"""`ModelFallback` on the engine: which models an agent's fallback may ask (registered with
the durability by a stable name, so their requests are units like the agent's own), and whether
a failed request is the fallback's to handle (it has a model it has not tried yet) rather than
an outage the model unit waits out or the run's verdict."""

from __future__ import annotations

from typing import Any

from pydantic_ai.capabilities import ModelFallback
from pydantic_ai.capabilities.abstract import leaf_capabilities
from pydantic_ai.models import Model


def fallback_models(pa_agent: Any) -> dict[str, Model]:
    """The `Model` instances an agent's `ModelFallback` may ask, known to the durability by a
    stable name (the order they are declared in), so their requests are units like the agent's."""
    models: dict[str, Model] = {}
    for cap in leaf_capabilities(pa_agent.root_capability):
        if isinstance(cap, ModelFallback):
            for candidate in cap.models:
                if isinstance(candidate, Model):
                    models[f"fallback-{len(models)}:{candidate.model_name}"] = candidate
    return models


class FallingBack(Exception):  # noqa: N818 - carries the model's own error out of the unit
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def fallback_left(params: Any) -> bool:
    """The agent's `ModelFallback` has a model it has not tried for this request yet: a failure
    is its to handle (it asks the next model), not an outage to wait out here. (Read from the
    run's capability instance: pydantic-ai 2.68 keeps the untried candidates in `_remaining`.)"""
    ctx = getattr(params, "run_context", None)
    root = getattr(ctx, "root_capability", None)
    if root is None:
        return False
    for cap in leaf_capabilities(root):
        if isinstance(cap, ModelFallback):
            left = getattr(cap, "_remaining", ())
            if any(not cap._already_attempted(candidate) for candidate in left):
                return True
    return False
