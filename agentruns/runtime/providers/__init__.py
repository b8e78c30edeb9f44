"""Models: Pydantic AI models by name (`models.py`), what their failures mean to the engine
(`model_errors.py`), their streams on the process's one loop (`stream_pump.py`)."""

from __future__ import annotations

from agentruns.runtime.providers.base import ModelError, TextSink, Usage

__all__ = ["ModelError", "TextSink", "Usage"]
