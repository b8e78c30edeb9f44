"""Worker processes: the slot pool that runs executors, the sweeper, and django-q2's cluster."""
