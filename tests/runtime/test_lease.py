"""The lease heartbeat: one keeper thread per process renews the leases of long steps."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from agentruns.models import Run
from agentruns.runtime.dispatch.lease import Heartbeat
from tests.helpers import leased_run

pytestmark = pytest.mark.django_db(transaction=True)  # the keeper has its own connection

TTL = 0.6


def _expires(run: Run):
    return Run.objects.get(id=run.id).lease_expires_at


def test_a_long_step_keeps_its_lease_and_a_stopped_beat_lets_it_go():
    run = leased_run("me:1:a", ttl_seconds=TTL)
    beat = Heartbeat(run.id, "me:1:a", TTL)
    beat.start()
    try:
        time.sleep(3 * TTL)  # three TTLs without any engine commit
        assert _expires(run) > timezone.now() and not beat.lost.is_set()
    finally:
        beat.stop()
    # a renewal the keeper had already begun when the beat stopped may still land (harmless: a
    # finished run's lease has no owner left to match); on a loaded machine it took 0.36 s
    time.sleep(TTL)
    last = _expires(run)
    time.sleep(2 * TTL)  # the keeper renews every TTL/3: six chances to do it again
    assert _expires(run) == last  # nobody renews a lease whose run is done


def test_beats_of_several_runs_share_the_keeper():
    runs = [leased_run(f"me:1:{i}", ttl_seconds=TTL) for i in range(3)]
    beats = [Heartbeat(r.id, f"me:1:{i}", TTL) for i, r in enumerate(runs)]
    for beat in beats:
        beat.start()
    try:
        time.sleep(3 * TTL)
        assert all(_expires(r) > timezone.now() for r in runs)
    finally:
        for beat in beats:
            beat.stop()


def test_a_stolen_lease_is_noticed():
    run = leased_run("me:1:a", ttl_seconds=TTL)
    beat = Heartbeat(run.id, "me:1:a", TTL)
    beat.start()
    try:
        Run.objects.filter(id=run.id).update(lease_owner="thief:2:b")
        deadline = time.monotonic() + 3 * TTL
        while not beat.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert beat.lost.is_set()
        assert Run.objects.get(id=run.id).lease_owner == "thief:2:b"
    finally:
        beat.stop()
