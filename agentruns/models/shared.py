"""Rows every process shares: the workers' heartbeats, the quota buckets, the concurrency keys
in use and the model providers' rate-limit buckets."""

from __future__ import annotations

from django.db import models


class WorkerHeartbeat(models.Model):
    """One row per worker process: /healthz reads how fresh the newest one is. `qcluster@...`
    rows are written by the sweeper loop, `pool@...` rows by each q2 worker process's run pool
    (runs in flight, capacity, whether it drains, its open database connections)."""

    POOL_PREFIX = "pool@"  # the run pools' rows (the web side reads them without the pool)

    worker = models.CharField(max_length=200, unique=True)
    last_seen_at = models.DateTimeField()
    last_sweep_at = models.DateTimeField(null=True, blank=True)
    runs_in_flight = models.PositiveIntegerField(default=0)
    run_capacity = models.PositiveIntegerField(default=0)
    draining = models.BooleanField(default=False)
    db_connections = models.PositiveIntegerField(default=0)
    # what the process saw since it started (runtime/outages/process_health.py): database and Redis
    # reachability, model-provider errors by class
    process_health = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.worker


class QuotaBucket(models.Model):
    """A token bucket (`runtime/access/quotas.py`): one row per user and kind, shared by every web
    process; `stamp` is the database clock (seconds) of the last check, `granted` its answer."""

    key = models.CharField(max_length=100, primary_key=True)
    tokens = models.FloatField()
    stamp = models.FloatField()
    granted = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"{self.key}: {self.tokens:.1f}"


class ModelRateBucket(models.Model):
    """One model's rate limit (AGENTRUNS_MODEL_LIMITS; `runtime/access/model_limits.py`), shared
    by every worker process: the slots its requests were given, on the database's clock
    (seconds). `slot` is the last request's; the next may not go before `next_request_at` (the
    requests a minute) nor before `next_token_at` (the tokens a minute)."""

    model = models.CharField(max_length=200, primary_key=True)
    slot = models.FloatField()
    next_request_at = models.FloatField()
    next_token_at = models.FloatField()

    def __str__(self) -> str:
        return f"{self.model}: next request at {self.next_request_at:.3f}"


class ConcurrencyKey(models.Model):
    """A concurrency key with a line (`runtime/dispatch/concurrency.py`): its row is what every
    admission to the key locks (FOR UPDATE), and `limit` is how many of the agent's runs sharing
    the key may hold it at once (the agent's declaration, as the latest start of the key saw
    it). The row goes when the key's last run lets it go."""

    agent = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    limit = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["agent", "key"], name="concurrency_key_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.agent} {self.key} (at most {self.limit})"
