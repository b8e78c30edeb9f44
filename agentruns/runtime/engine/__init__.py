"""The agent's own Pydantic AI loop as the run's durable execution (docs/engine-design.md)."""
