"""Who holds a run: worker identities and the lease heartbeat."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from .models import Run

log = logging.getLogger(__name__)


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Heartbeat(threading.Thread):
    """Extends the lease while a long step runs; every engine commit extends it as well."""

    def __init__(self, run_id: uuid.UUID, owner: str, ttl: float) -> None:
        super().__init__(name=f"lease-heartbeat-{run_id}", daemon=True)
        self.run_id, self.owner, self.ttl = run_id, owner, ttl
        self.stopped = threading.Event()
        self.lost = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.wait(self.ttl / 3):
                expires = timezone.now() + timedelta(seconds=self.ttl)
                held = Run.objects.filter(id=self.run_id, lease_owner=self.owner).update(
                    lease_expires_at=expires
                )
                if not held:
                    self.lost.set()
                    return
        except Exception:
            log.warning("lease heartbeat failed for run %s", self.run_id, exc_info=True)
        finally:
            connection.close()

    def stop(self) -> None:
        self.stopped.set()
