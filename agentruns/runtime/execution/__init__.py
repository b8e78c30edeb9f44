"""Running a run: the executor's slices, model and tool steps, cancel and the state transitions."""
