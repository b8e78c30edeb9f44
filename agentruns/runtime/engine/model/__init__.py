"""The model unit: a model request of the agent's loop as the run's model step."""
