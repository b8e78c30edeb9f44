"""Nudges: "new events exist" on the channel layer, sent after the commit (DESIGN.md 5).

At-most-once by design: a lost nudge costs latency, never data, because every reader re-reads
the database (the stream's feed polls as well).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from agentruns.conf import conf
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import redis_unavailable
from agentruns.runtime.threads import process_threads

log = logging.getLogger(__name__)

INBOX_GROUP = "approvals.inbox"

# set by the qcluster command: an in-memory channel layer cannot reach the web process from there
IN_WORKER_PROCESS = False


def run_group(run_id: uuid.UUID | str) -> str:
    return f"run.{uuid.UUID(str(run_id)).hex}"


def _nudges_reach_viewers() -> bool:
    # The in-memory layer only reaches consumers in this process; a worker's nudge would be lost
    # anyway, and the consumer's database poll covers it.
    return bool(conf.REDIS_URL) or not IN_WORKER_PROCESS


def _anyone_listens_here() -> bool:
    """In-memory layer: does any consumer of this process listen to any group at all?"""
    groups = getattr(get_channel_layer(), "groups", None)
    return groups is None or bool(groups)


def nudge_on_commit(run_id: uuid.UUID | None, seq: int = 0, *, inbox: bool = False) -> None:
    if not _nudges_reach_viewers():
        return
    if not conf.REDIS_URL and not _anyone_listens_here():
        return  # the engine's hot path outside a web process: nobody to reach, skip the hook
    transaction.on_commit(lambda: send_nudge(run_id, seq, inbox=inbox))


def nudge_runs_on_commit(last_seqs: list[tuple[uuid.UUID, int]]) -> None:
    """Nudge every run of `last_seqs` (run, its last seq) with ONE on-commit hook and one hand-over
    to the sender: the delta writer's tick writes text of many runs, and a hook, a future and a
    wake of the sender's loop per run was per-run work on every tick."""
    if not last_seqs or not _nudges_reach_viewers():
        return
    if not conf.REDIS_URL and not _anyone_listens_here():
        return
    transaction.on_commit(
        lambda: _send([(run_group(run_id), _run_nudge(seq)) for run_id, seq in last_seqs])
    )


_nudge_loop: Any = None  # (pid, event loop) of the background sender, see _nudge_sender_loop
_nudge_loop_lock = threading.Lock()


def _nudge_sender_loop() -> asyncio.AbstractEventLoop:
    """One long-lived event loop thread per process for cross-process nudges.

    async_to_sync would build a fresh loop, and channels_redis a fresh connection, for every
    nudge (~10 ms, measured in benchmarks/stream_latency.py), on the engine's commit path.
    Keyed by pid: a forked worker process starts its own."""
    global _nudge_loop
    with _nudge_loop_lock:
        if _nudge_loop is None or _nudge_loop[0] != os.getpid() or _nudge_loop[1].is_closed():
            loop = asyncio.new_event_loop()

            def serve() -> None:
                try:
                    loop.run_forever()
                finally:
                    loop.close()

            process_threads().start(
                "channel-nudges",
                serve,
                stop=lambda: loop.call_soon_threadsafe(loop.stop),
            )
            _nudge_loop = (os.getpid(), loop)
        return _nudge_loop[1]


def _run_nudge(seq: int) -> dict:
    return {"type": "run.nudge", "seq": seq}


def _messages(run_id: uuid.UUID | None, seq: int, inbox: bool) -> list[tuple[str, dict]]:
    sends = []
    if run_id is not None:
        sends.append((run_group(run_id), _run_nudge(seq)))
    if inbox:
        sends.append((INBOX_GROUP, {"type": "inbox.nudge"}))
    return sends


async def _group_send_all(layer: Any, sends: list[tuple[str, dict]]) -> None:
    # one after another on one connection: side by side, a tick's hundred-odd sends took more
    # than the client pool's 100 connections (MaxConnectionsError: nudges lost, Redis "away")
    listened = await _listened(layer, [group for group, _ in sends])
    for group, message in sends:
        if listened is None or group in listened:
            await layer.group_send(group, message)


async def _listened(layer: Any, groups: list[str]) -> set[str] | None:
    """The groups of `groups` someone is a member of, asked in one pipeline per Redis shard
    (None: every group, for a layer other than channels_redis's sorted-set one).

    channels_redis's `group_send` costs two round trips (prune the members, list them) even for
    a group without members, which is most runs of a delta tick: nobody watches them. A group
    whose members all expired still counts as listened to; its `group_send` prunes them."""
    from channels_redis.core import RedisChannelLayer  # only with Redis configured

    if not isinstance(layer, RedisChannelLayer):
        return None
    by_shard: dict[int, list[str]] = {}
    for group in groups:
        by_shard.setdefault(layer.consistent_hash(group), []).append(group)
    listened: set[str] = set()
    for shard, shard_groups in by_shard.items():
        pipe = layer.connection(shard).pipeline(transaction=False)
        for group in shard_groups:
            pipe.exists(layer._group_key(group))
        found = await pipe.execute()
        listened.update(group for group, n in zip(shard_groups, found, strict=True) if n)
    return listened


def _log_failed_nudge(future: concurrent.futures.Future) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is None:
        weather.redis.passed()
    elif redis_unavailable(exc):
        # Redis away: every commit would log this; once is enough (viewers poll meanwhile)
        weather.redis.noticed(exc, "the nudge sender")
    else:
        log.warning("channel-layer nudge failed: %r", exc)


def send_nudge(run_id: uuid.UUID | None, seq: int = 0, *, inbox: bool = False) -> None:
    """Tell viewers "new events exist". At-most-once by design: losing one costs latency only."""
    _send(_messages(run_id, seq, inbox))


def _send(sends: list[tuple[str, dict]]) -> None:
    """Send `sends` (group, message) on the channel layer; never raises."""
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        if conf.REDIS_URL:
            # cross-process layer: fire and forget on the background loop (never blocks a commit)
            future = asyncio.run_coroutine_threadsafe(
                _group_send_all(layer, sends), _nudge_sender_loop()
            )
            future.add_done_callback(_log_failed_nudge)
            return
        # in-memory layer: deliver on the caller's (the web server's) loop, where its consumers
        # are; a group nobody in this process listens to costs nothing (the engine's hot path)
        members = getattr(layer, "groups", None)
        for group, message in sends:
            if members is None or members.get(group):
                async_to_sync(layer.group_send)(group, message)
    except Exception:  # a nudge must never break the write it follows
        log.warning("channel-layer nudge failed", exc_info=True)
