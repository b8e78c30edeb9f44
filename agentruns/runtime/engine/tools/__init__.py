"""A tool call of the agent's loop as its step's durable unit (docs/engine-design.md)."""
