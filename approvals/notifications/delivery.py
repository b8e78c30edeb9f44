"""The sending side of the outbox: claim due deliveries, send them signed, record the outcome.

- A claim is a lease: rows are picked with `FOR UPDATE SKIP LOCKED` (two workers never pick the
  same row) and stamped with this worker and an expiry longer than a try can take; the HTTP call
  happens outside any transaction. A worker that dies (SIGKILL) leaves its lease to expire and
  the row is tried again by whoever comes next, with the same `webhook-id`: at least once.
- The outcome is written fenced on the lease (a worker whose lease was taken over writes
  nothing), one row at a time.
- 2xx: delivered. 410 Gone: the receiver asked us to stop: failed, and an admin endpoint is
  switched off. Anything else (non-2xx, timeout, refused connection): retried after an
  exponential delay with jitter (honouring a Retry-After), until AGENTRUNS_WEBHOOK_MAX_ATTEMPTS
  tries; then failed, kept with its attempts and last response for the admin's "redeliver".
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

import httpx
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agentruns import backoff
from agentruns.runtime.values.timestamps import iso
from approvals.conf import conf
from approvals.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from approvals.notifications.outbox import settings_endpoint_events
from approvals.notifications.signing import BadSecret, signed_headers

log = logging.getLogger(__name__)

RESPONSE_KEEP_BYTES = 2000  # of the receiver's answer, for the admin
ATTEMPT_LOG_KEEP = 50
BACKOFF_FACTOR = 4
JITTER = 0.2  # +- fraction of each delay
USER_AGENT = "agentruns-webhooks/1"


# ------------------------------------------------------------------ the schedule
def retry_delay(failed_tries: int, jitter: float | None = None) -> float:
    """Seconds to wait after the `failed_tries`-th failed try: base x 4^(n-1), capped, +-20%."""
    return backoff.delay(
        failed_tries,
        base=conf.WEBHOOK_RETRY_BASE_SECONDS,
        cap=conf.WEBHOOK_RETRY_MAX_SECONDS,
        jitter=JITTER,
        factor=BACKOFF_FACTOR,
        at=None if jitter is None else jitter / JITTER,
    )


def shortest_retry_span() -> float:
    """How long the retries last at the least (every jitter at -20%): first to last try."""
    return sum(retry_delay(n, jitter=-JITTER) for n in range(1, conf.WEBHOOK_MAX_ATTEMPTS))


def lease_seconds() -> float:
    """Longer than one try can take (connect + send + read, each bounded by the timeout)."""
    timeout = conf.WEBHOOK_TIMEOUT_SECONDS
    return 3 * timeout + 5


# ------------------------------------------------------------------ claiming
def claim_due(owner: str, limit: int, now: datetime | None = None) -> list[WebhookDelivery]:
    """Lease up to `limit` due deliveries for `owner` (skipping rows another worker is
    claiming right now, and rows whose lease is still live)."""
    now = now or timezone.now()
    due = WebhookDelivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lte=now
    ).filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
    if not due.exists():
        return []  # the common case, without a transaction (SQLite takes its write lock at BEGIN)
    with transaction.atomic():
        rows = list(
            due.select_for_update(skip_locked=True).order_by("next_attempt_at", "id")[:limit]
        )
        if not rows:
            return []
        expires = now + timedelta(seconds=lease_seconds())
        WebhookDelivery.objects.filter(id__in=[r.id for r in rows]).update(
            lease_owner=owner, lease_expires_at=expires
        )
    endpoints = WebhookEndpoint.objects.in_bulk({r.endpoint_id for r in rows if r.endpoint_id})
    for row in rows:
        row.lease_owner, row.lease_expires_at = owner, expires
        if row.endpoint_id:
            row.endpoint = endpoints.get(row.endpoint_id)
    return rows


# ------------------------------------------------------------------ sending
@dataclass
class Outcome:
    status_code: int | None = None
    response: str = ""
    error: str = ""
    ms: int = 0
    retry_after: float | None = None
    # not tried at all (no such endpoint any more): failed without counting a try
    undeliverable: bool = False

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def target_of(delivery: WebhookDelivery) -> tuple[str, str] | str:
    """(url, secret), or why it cannot be sent."""
    if delivery.endpoint_id is None:
        if delivery.event_type not in settings_endpoint_events():
            return "AGENTRUNS_WEBHOOK_URL is no longer set (or no longer takes this event)"
        return conf.WEBHOOK_URL, conf.WEBHOOK_SECRET
    endpoint = delivery.endpoint
    if endpoint is None:
        return "the endpoint was deleted"
    if not endpoint.active:
        return "the endpoint is switched off" + (
            f" ({endpoint.disabled_reason})" if endpoint.disabled_reason else ""
        )
    return endpoint.url, endpoint.secret


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the receiver asked us to wait: `Retry-After` as delay-seconds or as an HTTP-date
    (RFC 9110 10.2.3); None when absent or unreadable (then the backoff alone decides)."""
    raw = response.headers.get("retry-after", "").strip()
    if raw.isascii() and raw.isdigit():
        return float(raw)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT; a zoneless date is not one
        return None
    return max(0.0, (when - timezone.now()).total_seconds())


def send(delivery: WebhookDelivery, client: httpx.Client) -> Outcome:
    target = target_of(delivery)
    if isinstance(target, str):
        return Outcome(error=target, undeliverable=True)
    url, secret = target
    try:
        headers = signed_headers(secret, delivery.webhook_id, delivery.body)
    except BadSecret as exc:
        return Outcome(error=f"cannot sign: {exc}", undeliverable=True)
    headers.update({"content-type": "application/json", "user-agent": USER_AGENT})
    timeout = conf.WEBHOOK_TIMEOUT_SECONDS
    started = time.monotonic()
    try:
        with client.stream(
            "POST",
            url,
            content=delivery.body.encode(),
            headers=headers,
            timeout=timeout,
        ) as response:
            kept = b""
            for chunk in response.iter_bytes():
                kept += chunk
                # enough for the admin; and a receiver dripping its answer does not outlast
                # the lease (each read is bounded by the timeout, the whole by this)
                if len(kept) >= RESPONSE_KEEP_BYTES or time.monotonic() - started > 2 * timeout:
                    break
            return Outcome(
                status_code=response.status_code,
                response=kept[:RESPONSE_KEEP_BYTES].decode("utf-8", "replace"),
                ms=int((time.monotonic() - started) * 1000),
                retry_after=_retry_after(response),
            )
    except httpx.TimeoutException:
        error = f"timed out after {timeout:g} s"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    except ValueError as exc:  # an unusable URL
        return Outcome(error=f"bad URL: {exc}"[:500], undeliverable=True)
    return Outcome(error=error, ms=int((time.monotonic() - started) * 1000))


# ------------------------------------------------------------------ recording
def record(delivery: WebhookDelivery, owner: str, outcome: Outcome) -> bool:
    """Write the outcome of one try, fenced on `owner`'s lease. False: the lease was lost (another
    worker took the row over after it expired) and nothing was written."""
    now = timezone.now()
    tries = delivery.attempts + (0 if outcome.undeliverable else 1)
    entry = {
        "at": iso(now),
        "status": outcome.status_code,
        "error": outcome.error,
        "ms": outcome.ms,
        "by": owner,
    }
    fields: dict = {
        "attempts": tries,
        "attempt_log": [*delivery.attempt_log, entry][-ATTEMPT_LOG_KEEP:],
        "lease_owner": "",
        "lease_expires_at": None,
        "last_error": outcome.error,
    }
    if not outcome.undeliverable:
        fields.update(
            last_attempt_at=now,
            last_status_code=outcome.status_code,
            last_response=outcome.response,
        )
    if outcome.ok:
        fields.update(status=DeliveryStatus.DELIVERED, delivered_at=now)
    elif outcome.undeliverable or outcome.status_code == 410 or tries >= conf.WEBHOOK_MAX_ATTEMPTS:
        fields["status"] = DeliveryStatus.FAILED
    else:
        delay = retry_delay(tries)
        if outcome.retry_after is not None:
            delay = max(delay, min(outcome.retry_after, conf.WEBHOOK_RETRY_MAX_SECONDS))
        fields["next_attempt_at"] = now + timedelta(seconds=delay)
    with transaction.atomic():
        written = WebhookDelivery.objects.filter(
            id=delivery.id, status=DeliveryStatus.PENDING, lease_owner=owner
        ).update(**fields)
        if written and outcome.status_code == 410 and delivery.endpoint_id:
            WebhookEndpoint.objects.filter(id=delivery.endpoint_id).update(
                active=False, disabled_reason=f"the receiver answered 410 Gone at {iso(now)}"
            )
    if not written:
        log.warning("webhook %s: lease lost while sending; the next holder retries", delivery.id)
    return bool(written)


def deliver_due(owner: str, client: httpx.Client, pool: ThreadPoolExecutor | None = None) -> int:
    """One pass: claim what is due, send it (concurrently when a pool is given), record.
    Returns how many tries were made."""
    rows = claim_due(owner, conf.WEBHOOK_CONCURRENCY)
    if not rows:
        return 0
    if pool is None or len(rows) == 1:
        outcomes = [send(row, client) for row in rows]
    else:
        # only the HTTP calls run in the pool; the database is written from this thread
        outcomes = list(pool.map(lambda row: send(row, client), rows))
    for row, outcome in zip(rows, outcomes, strict=True):
        record(row, owner, outcome)
    return len(rows)


def redeliver(ids: list[int], *, by: str) -> int:
    """Send these deliveries again (failed or delivered), with their original webhook id and
    body, and a fresh retry budget."""
    now = timezone.now()
    count = 0
    with transaction.atomic():
        for delivery in WebhookDelivery.objects.select_for_update().filter(id__in=ids):
            entry = {"at": iso(now), "status": None, "error": f"redelivery asked by {by}", "ms": 0}
            delivery.attempt_log = [*delivery.attempt_log, entry][-ATTEMPT_LOG_KEEP:]
            delivery.status, delivery.attempts = DeliveryStatus.PENDING, 0
            delivery.next_attempt_at, delivery.delivered_at = now, None
            delivery.lease_owner, delivery.lease_expires_at = "", None
            delivery.save(
                update_fields=[
                    "attempt_log",
                    "status",
                    "attempts",
                    "next_attempt_at",
                    "delivered_at",
                    "lease_owner",
                    "lease_expires_at",
                ]
            )
            count += 1
    return count
