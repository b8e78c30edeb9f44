"""The process's delta writer (runtime/execution/delta_writer.py) on a real PostgreSQL: the text of
several runs goes out in one statement per tick, fenced on each run's lease, and closing a feed
hands back what no flush took. The writer thread has a connection of its own, hence committed
test data (transaction=True)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from agentruns.models import Run, RunEvent
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.execution.delta_writer import DeltaWriter
from agentruns.runtime.store import get_store
from agentruns.runtime.store.base import RunDeltas
from agentruns.runtime.store.nudges import run_group
from tests.helpers import assert_gapless, leased_run
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def delta_texts(run: Run) -> list[str]:
    return [
        e.data["text"] for e in RunEvent.objects.filter(run=run, type="model.delta").order_by("seq")
    ]


def test_several_runs_share_one_commit_and_keep_their_seqs():
    writer = DeltaWriter(tick_s=0.2, flush_chars=10_000)
    # a lease about to lapse: the writer's commits renew it
    runs = [leased_run(owner=f"me:1:{i}", ttl_seconds=1) for i in range(3)]
    cancels: list[bool] = []
    feeds = [writer.open(run.id, f"me:1:{i}", 0, 1, cancels.append) for i, run in enumerate(runs)]
    for round_ in range(3):
        for feed in feeds:
            feed.add(f"a{round_}")
            feed.add(f"b{round_}")
        time.sleep(0.25)
    tails = [feed.close() for feed in feeds]
    for run, tail in zip(runs, tails, strict=True):
        assert_gapless(run)
        # nothing lost, nothing twice, in order: flushed text + what closing handed back
        assert "".join(delta_texts(run)) + tail == "a0b0a1b1a2b2"
        assert Run.objects.get(id=run.id).lease_expires_at > run.lease_expires_at
    stamps = RunEvent.objects.filter(run__in=runs, type="model.delta").values_list(
        "created_at", "run_id"
    )
    by_commit: dict = {}
    for at, run_id in stamps:
        by_commit.setdefault(at, set()).add(run_id)
    assert any(len(ids) == 3 for ids in by_commit.values()), "one commit carried all three runs"
    assert cancels and not any(cancels)


def test_a_run_whose_lease_moved_writes_nothing_and_its_executor_is_told():
    writer = DeltaWriter(tick_s=0.05, flush_chars=10_000)
    ours, stolen = leased_run(owner="me:1:a"), leased_run(owner="me:1:b")
    Run.objects.filter(id=stolen.id).update(lease_owner="thief:2:x")
    kept = writer.open(ours.id, "me:1:a", 0, 1, lambda cancel: None)
    lost = writer.open(stolen.id, "me:1:b", 0, 1, lambda cancel: None)
    kept.add("mine")
    lost.add("not mine")
    wait_until(lambda: lost.failure is not None, timeout=10, message="the flush")
    with pytest.raises(LeaseLost):
        lost.add("more")
    with pytest.raises(LeaseLost):
        lost.close()
    assert delta_texts(stolen) == []
    assert Run.objects.get(id=stolen.id).last_seq == stolen.last_seq
    assert "".join(delta_texts(ours)) + kept.close() == "mine"
    assert_gapless(ours)


def test_a_cancel_requested_meanwhile_reaches_the_executor():
    writer = DeltaWriter(tick_s=0.05, flush_chars=10_000)
    run = leased_run()
    Run.objects.filter(id=run.id).update(cancel_requested=True)
    seen: list[bool] = []
    feed = writer.open(run.id, "me:1:abc", 0, 1, seen.append)
    feed.add("x")
    wait_until(lambda: seen, timeout=10, message="the flush")
    assert seen == [True]
    feed.close()


def test_one_tick_nudges_every_run_it_wrote_with_its_last_seq():
    """The tick's nudges go out together (one hook for the statement); each viewer's group still
    gets its own run's last seq, and a run whose lease moved (nothing written) gets none."""
    layer = get_channel_layer()
    runs = [leased_run(owner=f"me:1:{i}") for i in range(3)]
    Run.objects.filter(id=runs[2].id).update(lease_owner="thief:2:x")
    channels = [async_to_sync(layer.new_channel)() for _ in runs]
    for run, channel in zip(runs, channels, strict=True):
        async_to_sync(layer.group_add)(run_group(run.id), channel)
    now = timezone.now()
    deltas = [
        RunDeltas(
            run_id=run.id,
            owner=f"me:1:{i}",
            lease_expires_at=now + timedelta(seconds=30),
            events=[("model.delta", {"step": 0, "attempt": 1, "text": f"t{i}"})],
        )
        for i, run in enumerate(runs)
    ]
    done = get_store().commit_deltas(deltas, now=now)
    assert set(done) == {runs[0].id, runs[1].id}

    async def next_message(channel: str) -> dict | None:
        try:
            return await asyncio.wait_for(layer.receive(channel), timeout=1)
        except TimeoutError:
            return None

    for run, channel in zip(runs[:2], channels[:2], strict=True):
        last_seq = Run.objects.get(id=run.id).last_seq
        assert async_to_sync(next_message)(channel) == {"type": "run.nudge", "seq": last_seq}
    assert async_to_sync(next_message)(channels[2]) is None
