"""How work reaches a process: the lease that fences a run's owner, the queue and django-q2's doorbell broker, each thread's database connection."""
