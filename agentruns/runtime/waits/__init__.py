"""Waits tool code makes (an outside event by token, a timer, the thread's next message), the
hooks and messages that resolve them and the timers that come due: the product side of the
engine's waits (engine/waits.py).

- `tools.py`: `wait_for_event`, `wait_for_message` and the durable sleeps, as the runtime keeps them (installed into
  the registry at start-up): a `Wait` row of the call's step, found again by its order in the
  call; the run parks while it is pending and the call runs again once it is resolved.
- `hooks.py`: resolving a token from outside (`POST /api/hooks/<token>`): once, 404, 409.
- `replies.py`: a message posted to a thread answering its run that waits for one.
- `due.py`: waits past their `due_at` (timers wake, event timeouts fail): one indexed query a
  second, made by the thread that already looks at the database (each cluster's sweeper).
"""
