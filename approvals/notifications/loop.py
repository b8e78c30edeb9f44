"""The delivery loop: a thread in every `qcluster` process, beside the sweeper.

Every AGENTRUNS_WEBHOOK_POLL_SECONDS it sends what is due from the outbox (several at once) and
the mail digests that are ready. Any number of workers may run it: deliveries and notices are
claimed with leases and SKIP LOCKED, so two workers never send the same one at once. While the
database is away it backs off (`runtime/outages/weather.py`) and logs the outage once.
"""

from __future__ import annotations

import logging

import httpx
from django.db import close_old_connections, connection

from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.threads import OwnedThread, process_threads
from agentruns.runtime.values.ids import worker_id
from approvals.conf import conf
from approvals.notifications.delivery import deliver_due
from approvals.notifications.mail import send_due_digests

log = logging.getLogger(__name__)


class DeliveryLoop(OwnedThread):
    name = "agentruns-deliveries"

    def __init__(self) -> None:
        super().__init__()
        self.owner = f"deliveries@{worker_id()}"

    def run(self) -> None:
        # no redirects: a 3xx is a failure (Standard Webhooks: fix the URL instead)
        client = httpx.Client(follow_redirects=False)
        pool = process_threads().executor("webhook-send", conf.WEBHOOK_CONCURRENCY)
        # the database away: tries further apart, up to 5 s (a delivery waits; none is lost)
        backoff = weather.Backoff(base=conf.WEBHOOK_POLL_SECONDS, cap=5.0)
        try:
            while not self.stopped.is_set():
                busy = False
                wait = conf.WEBHOOK_POLL_SECONDS
                try:
                    close_old_connections()
                    # a full batch: more may be due, go again without waiting
                    busy = deliver_due(self.owner, client, pool) >= conf.WEBHOOK_CONCURRENCY
                    send_due_digests(self.owner)
                    weather.database.passed()
                    backoff.reset()
                except Exception as exc:
                    if is_infrastructure_error(exc):
                        weather.database.noticed(exc, "the delivery loop")
                        wait = max(wait, backoff.next())
                    else:
                        log.warning("delivery pass failed", exc_info=True)
                    connection.close()
                if not busy:
                    self.stopped.wait(wait)
        finally:
            pool.shutdown(wait=False)
            client.close()
            connection.close()
