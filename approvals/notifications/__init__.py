"""Telling people: signed webhooks from a durable outbox, and batched email.

- `outbox`: the writers. Called inside the transaction of the change they report (an item
  opened, escalated, decided or withdrawn; a run failing), so an event exists exactly when its
  change committed. Part of the runtime layer: the executor and the sweeper call it.
- `signing`: Standard Webhooks secrets, ids and signatures (the `standardwebhooks` library).
- `delivery`: the worker's side: claim due deliveries (lease + SKIP LOCKED), send, retry with
  backoff and jitter, mark failed after the last try; `redeliver` for the admin.
- `mail`: one digest per person for what accumulated (new items to who may decide, escalated
  ones to the escalation group).
- `loop`: the thread inside `qcluster` that runs both.
"""
