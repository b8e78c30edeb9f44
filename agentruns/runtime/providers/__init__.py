"""Models: Pydantic AI models by name (`models.py`), what their failures mean to the engine
(`model_errors.py`); a request runs in its run's task on the process's one loop
(`engine/lanes.py`)."""

from __future__ import annotations

from agentruns.runtime.providers.base import ModelError, Usage

__all__ = ["ModelError", "Usage"]
