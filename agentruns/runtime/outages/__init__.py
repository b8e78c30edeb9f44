"""Weather versus verdicts: which errors are outages, backing off through them, the model-provider outage, process health."""
