"""TRANSITION ONLY (branch h8-engine, removed before it lands): H8_ENGINE=new runs every slice on
the agent's own loop (`engine/executor.py`), otherwise on the loop it replaces."""

import os

if os.environ.get("H8_ENGINE", "new") == "new":
    from agentruns.runtime.engine.executor import RunExecutor
else:
    from agentruns.runtime.execution.executor import RunExecutor

__all__ = ["RunExecutor"]
