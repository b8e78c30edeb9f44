"""Operation keys (DESIGN.md 4.13): at most one successful execution per business key across
all runs, enforced by unique constraints, and a lead's "allow one more".

A side-effect tool declares a key from its arguments (`operation_key=`, registry/operations.py).
Each call that takes the key is one `OperationExecution` row, written in the commit that starts
the call (its "before" commit) and settled in the commit that records its result, so a key
survives any crash exactly like the step it belongs to. Slot 1 is the key's first execution;
each `OperationAllowance` opens one more slot. The rows keep plain run and step ids, not foreign
keys: a key outlives its run (purging old runs must not free it).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

KEY_MAX = 200


class OperationState(models.TextChoices):
    # a call holds the key: it is being made, will be made again (a retry, a crash recovery with
    # the same idempotency key), or its outcome is unknown until a person reconciles it
    HELD = "held"
    # it was executed (its result is kept for the calls after it), or its outcome stays unknown
    # for good (aborted, or its run cancelled mid-call): nobody can say it did not happen
    DONE = "done"
    # it did not happen (failed for good, refused, or it never reached its server): the slot is
    # free again
    RELEASED = "released"


class OperationExecution(models.Model):
    key = models.CharField(max_length=KEY_MAX)
    slot = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=OperationState.choices)
    run_id = models.UUIDField()
    step_id = models.UUIDField()
    tool = models.CharField(max_length=100)
    # the call's result once done: what a later call of the key is answered with
    result = models.JSONField(null=True, blank=True)
    # runs waiting for the key while it is held: their doorbells ring when it is settled
    waiters = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["key", "slot", "id"]
        constraints = [
            # the promise itself: one live execution per slot of a key...
            models.UniqueConstraint(
                fields=["key", "slot"],
                condition=~Q(state="released"),
                name="operation_one_execution_per_slot",
            ),
            # ...one call in flight per key, so a limit is checked with the key's earlier
            # executions settled...
            models.UniqueConstraint(
                fields=["key"], condition=Q(state="held"), name="operation_one_held_per_key"
            ),
            # ...and one live row per step (a resumed call finds its own)
            models.UniqueConstraint(
                fields=["step_id"],
                condition=~Q(state="released"),
                name="operation_one_live_per_step",
            ),
        ]
        # a run that ends settles the keys it still holds (runtime/operations/executions.py)
        indexes = [
            models.Index(
                fields=["run_id"], condition=Q(state="held"), name="operation_held_run_idx"
            )
        ]

    def __str__(self) -> str:
        return f"{self.key} #{self.slot} ({self.state})"


class OperationAllowance(models.Model):
    """A lead allowed one more execution of a key: slot `slot` (2, 3, ...) may be taken. Who,
    when, why, and the run it was given for: part of the audit trail."""

    key = models.CharField(max_length=KEY_MAX)
    slot = models.PositiveIntegerField()
    granted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    granted_by_name = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    run_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["key", "slot"]
        constraints = [
            # two leads allowing "one more" at once allow one, not two
            models.UniqueConstraint(fields=["key", "slot"], name="operation_one_allowance_per_slot")
        ]

    def __str__(self) -> str:
        return f"{self.key}: slot {self.slot} allowed by {self.granted_by_name or 'someone'}"
