"""`ws/runs/<run_id>/?after=<seq>`: replay from the database, then tail (DESIGN.md 5).

Channel-layer messages are only nudges: nothing in them is ever sent to a client. Every frame
comes from a database read of `seq > last sent`, so a dropped nudge costs latency, never data,
and frames leave each connection in seq order exactly once.

Fan-out: all viewers of one run in one process share a `RunFeed`. The feed is the only group
member for that run in this process (one nudge per process, not one per viewer), does one
database read per wakeup or poll tick, renders each frame's fragment and JSON once, and keeps a
bounded window of recent frames. A viewer behind that window (a reconnect with an old `after=`)
replays from the database on its own until it reaches the window, then tails from it.
The AI SDK streams (`ui_stream.py`) read the events themselves and only need to know that the
run moved: they are the feed's `watchers`. While a feed has watchers and no socket, it reads
only the run's `last_seq` (bumped in the transaction that writes the events) and renders nothing.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import json
import logging
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer

from agentruns.conf import conf
from agentruns.models import Run
from agentruns.runtime.access import cache
from agentruns.runtime.access.quotas import QuotaExceeded
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error, redis_unavailable
from agentruns.runtime.store.nudges import run_group
from agentruns.stream.access import viewers
from agentruns.stream.access.slots import SLOTS, TRY_LATER, Slot
from agentruns.stream.frames import encoded_frames_after
from agentruns.stream.unavailable import REASON, TRY_AGAIN_LATER

log = logging.getLogger(__name__)

BATCH = 500  # frames per database read
WINDOW = 2000  # recent frames a feed keeps for viewers that are (nearly) caught up
GAP_PATIENCE_SECONDS = 5.0  # how long a feed waits for a missing seq before delivering past it

# close codes: 4400 bad request, 4401 not authenticated, 4403 forbidden, 4404 no such run,
# 4503 the database is unavailable, try again later (stream/unavailable.py). The page's client
# treats 4400-4499 as refusals (no reconnect); anything else is retried with backoff,
# 4013 ("try again later": no free stream slot, stream/access/slots.py) with a longer wait. A socket
# whose viewer loses the right to watch closes with 4401 or 4403 (stream/access/viewers.py).


@dataclass(eq=False)
class RunFeed:
    """Shared tail of one run for the viewers in this process (see the module docstring)."""

    run_id: str
    head: int  # highest seq read so far
    seqs: list[int] = field(default_factory=list)  # the window: seqs up to head, ascending
    frames: list[str] = field(default_factory=list)  # the window: JSON text, parallel to seqs
    viewers: set = field(default_factory=set)  # the consumers' wakeup events
    watchers: set = field(default_factory=set)  # wakeups of readers that need no frames
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)
    channel: str | None = None
    gap_since: float | None = None
    outages: int = 0  # failed reads for an outage: each closes the viewers it finds (4503)

    def frames_after(self, seq: int) -> list[tuple[int, str]] | None:
        """Frames with seq > `seq` from the window; None when `seq` is older than the window."""
        if seq >= self.head:
            return []
        if not self.seqs or seq + 1 < self.seqs[0]:
            return None
        start = bisect.bisect_right(self.seqs, seq)
        return list(zip(self.seqs[start:], self.frames[start:], strict=True))

    def extend(self, frames: list[tuple[int, str]]) -> None:
        for seq, text in frames:
            self.seqs.append(seq)
            self.frames.append(text)
            self.head = seq
        if len(self.frames) > WINDOW:
            drop = len(self.frames) - WINDOW
            del self.seqs[:drop]
            del self.frames[:drop]
        self._wake()

    def advance(self, head: int) -> None:
        """The run moved to `head` while no socket watched: nothing was rendered, so the window
        starts again after it (a socket that joins later replays from the database)."""
        if head > self.head:
            self.seqs.clear()
            self.frames.clear()
            self.head, self.gap_since = head, None
            self._wake()

    def _wake(self) -> None:
        for wakeup in (*self.viewers, *self.watchers):
            wakeup.set()


_FEEDS: dict[tuple[int, str], RunFeed] = {}


async def open_feed(run_id: str, head: int | None = None) -> RunFeed:
    """The process's feed for a run (created on first viewer): subscribed before its first read.
    `head`: the run's last_seq as the caller just read it (saves a read; a commit between that
    read and the subscription is found by the feed's first read, which follows it)."""
    key = (id(asyncio.get_running_loop()), run_id)
    feed = _FEEDS.get(key)
    if feed is not None:
        return feed
    if head is None:
        head = await database_sync_to_async(_run_last_seq)(run_id)
    feed = _FEEDS.get(key)  # another viewer may have opened it while we read
    if feed is not None:
        return feed
    feed = RunFeed(run_id=run_id, head=head)
    _FEEDS[key] = feed
    layer = get_channel_layer()
    if layer is not None:
        try:
            feed.channel = await layer.new_channel()
            await layer.group_add(run_group(run_id), feed.channel)
            feed.tasks.append(_detached(_listen(feed, layer)))
        except Exception as exc:  # no layer (Redis down): the poll alone keeps the stream whole
            _layer_fault(exc, f"run {run_id}: no channel-layer subscription, polling only")
            feed.channel = None
    feed.tasks.append(_detached(_follow(feed)))
    return feed


def _detached(work: Coroutine[Any, Any, None]) -> asyncio.Task:
    """A feed's task, in an empty context: it outlives the socket or SSE request that opened
    the feed, so it must not inherit that request's thread (stream/http_handler.py)."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())


async def close_feed_if_idle(run_id: str, feed: RunFeed) -> None:
    if feed.viewers or feed.watchers:
        return
    key = (id(asyncio.get_running_loop()), run_id)
    if _FEEDS.get(key) is feed:
        del _FEEDS[key]
    for task in feed.tasks:
        task.cancel()
    layer = get_channel_layer()
    if layer is not None and feed.channel is not None:
        try:
            await layer.group_discard(run_group(run_id), feed.channel)
        except Exception as exc:  # the layer may be gone (Redis restarting): membership expires
            _layer_fault(exc, f"group_discard failed for run {run_id}")


async def _listen(feed: RunFeed, layer) -> None:
    """Turn nudges into wakeups. Their content is ignored: the database is the only source."""
    while True:
        try:
            await layer.receive(feed.channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. Redis away: the poll keeps the stream going meanwhile
            _layer_fault(exc, f"channel layer receive failed for run {feed.run_id}")
            await asyncio.sleep(1.0)
            try:  # a restarted Redis may have lost the group: join again (idempotent)
                await layer.group_add(run_group(feed.run_id), feed.channel)
            except Exception:
                pass
            continue
        weather.redis.passed()
        feed.wake.set()


def _layer_fault(exc: BaseException, what: str) -> None:
    """Redis away is weather: one line per process and outage (`weather.redis`), not a
    traceback per feed per second; anything else is logged as it happens."""
    if redis_unavailable(exc):
        weather.redis.noticed(exc, "the run stream")
    else:
        log.warning("%s", what, exc_info=True)


async def _follow(feed: RunFeed) -> None:
    """Read new events on every nudge, and at least every AGENTRUNS_STREAM_POLL_SECONDS."""
    poll = conf.STREAM_POLL_SECONDS
    loop = asyncio.get_running_loop()
    while True:
        feed.wake.clear()
        tick = loop.time()  # fixed-rate ticks: the read's own time does not stretch the interval
        frames: list[tuple[int, str]] = []
        try:
            if feed.viewers:
                frames = await database_sync_to_async(encoded_frames_after)(
                    feed.run_id, feed.head, BATCH
                )
            else:  # watchers only: no frame is sent, so none is rendered
                feed.advance(await database_sync_to_async(_run_last_seq)(feed.run_id))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a database blip: keep the feed alive, try again next tick
            if is_infrastructure_error(exc):  # its viewers reconnect with backoff (4503)
                feed.outages += 1
                for wakeup in feed.viewers:
                    wakeup.set()
            else:
                log.warning("run feed %s: read failed", feed.run_id, exc_info=True)
        contiguous = _contiguous_prefix(feed, frames)
        if contiguous:
            feed.extend(contiguous)
        if len(frames) == BATCH and len(contiguous) == len(frames):
            continue  # more backlog: read on without waiting
        try:
            await asyncio.wait_for(feed.wake.wait(), timeout=max(0.0, tick + poll - loop.time()))
        except TimeoutError:
            pass


def _contiguous_prefix(feed: RunFeed, frames: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Frames up to the first hole. Seqs commit in order (events.py), so a hole means a read
    raced a commit; it closes on the next read. A hole that never closes would be a bug
    elsewhere: after GAP_PATIENCE_SECONDS it is logged and skipped rather than stall viewers."""
    expected = feed.head + 1
    out = []
    for seq, text in frames:
        if seq != expected:
            now = time.monotonic()
            if feed.gap_since is None:
                feed.gap_since = now
            if now - feed.gap_since < GAP_PATIENCE_SECONDS:
                return out
            log.error("run %s: seq %s never appeared; continuing at %s", feed.run_id, expected, seq)
        feed.gap_since = None
        out.append((seq, text))
        expected = seq + 1
    return out


def _run_last_seq(run_id: str) -> int:
    return _run_head(run_id) or 0


def _run_head(run_id: str) -> int | None:
    """The run's last_seq; None when there is no such run."""
    return Run.objects.filter(id=run_id).values_list("last_seq", flat=True).first()


class RunStreamConsumer(AsyncWebsocketConsumer):
    # No channel of its own: the shared RunFeed is the only layer subscriber. An unconfigured
    # alias makes Channels skip the per-socket channel, so a layer outage (Redis down) cannot
    # break open sockets; the feed's poll carries on.
    channel_layer_alias = "run-stream-feed-only"

    async def connect(self) -> None:
        self.run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        self.feed: RunFeed | None = None
        self.sender: asyncio.Task | None = None
        self.wakeup = asyncio.Event()
        self.slot: Slot | None = None
        self.viewer: viewers.Viewer | None = None
        # accept first, so refusals reach the client as close codes with a reason (a refused
        # handshake would only show as a generic failure in browsers)
        await self.accept()
        refusal = await self.refusal()
        if refusal is not None:
            await self.close(code=refusal[0], reason=refusal[1])
            return
        try:  # one count with the chat's SSE streams
            self.slot = SLOTS.take(self.scope["user"].pk)
        except QuotaExceeded as busy:
            await self.close(code=TRY_LATER, reason=str(busy))
            return
        self.feed = await open_feed(self.run_id, self.head)
        self.outages_seen = self.feed.outages
        self.feed.viewers.add(self.wakeup)
        self.sender = asyncio.create_task(self.pump())
        # closed within 2 s of its viewer losing the credential (4401: the page does not
        # reconnect with it) or the right to watch (4403); one recheck per process, not per socket
        self.viewer = viewers.viewer_of_scope(self.scope)
        if self.viewer is not None:
            viewers.watch().add(self.viewer, self.viewer_ended)

    def viewer_ended(self, ending: viewers.Ending) -> None:
        self.viewer = None  # the watch has dropped it
        if self.sender is not None:
            self.sender.cancel()
        asyncio.get_running_loop().create_task(self.close(code=ending.code, reason=ending.reason))

    async def refusal(self) -> tuple[int, str] | None:
        user = self.scope.get("user")
        if self.scope.get("auth_error"):
            return 4401, str(self.scope["auth_error"])
        if user is None or not user.is_authenticated:
            return 4401, "login required"
        # a token's user has its permissions in memory (runtime/access/cache.py): no thread hop
        if cache.answers_from_memory(user):
            allowed = user.has_perm(viewers.VIEW_RUN)
        else:
            allowed = await database_sync_to_async(user.has_perm)(viewers.VIEW_RUN)
        if not allowed:
            return 4403, f"permission {viewers.VIEW_RUN} required"
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.last_seq = max(0, int(query.get("after", ["0"])[0] or 0))
            uuid.UUID(self.run_id)
        except ValueError:
            return 4400, "after must be an integer"
        # the run's last_seq, which the feed starts from: one read for both
        self.head = await database_sync_to_async(_run_head)(self.run_id)
        if self.head is None:
            return 4404, "no such run"
        return None

    async def disconnect(self, code: int) -> None:
        if self.sender is not None:
            self.sender.cancel()
        if self.viewer is not None:
            viewers.watch().discard(self.viewer, self.viewer_ended)
            self.viewer = None
        if self.slot is not None:
            self.slot.release()
            self.slot = None
        if self.feed is not None:
            self.feed.viewers.discard(self.wakeup)
            await close_feed_if_idle(self.run_id, self.feed)
            self.feed = None

    async def receive(self, text_data=None, bytes_data=None) -> None:
        # clients may send {"type": "ping"} (keepalive through proxies); anything else is ignored
        if text_data and '"ping"' in text_data:
            await self.send(text_data=json.dumps({"type": "pong", "seq": self.last_seq}))

    async def pump(self) -> None:
        """Send every frame with seq > last_seq, in order, forever."""
        try:
            while True:
                self.wakeup.clear()
                assert self.feed is not None
                if self.feed.outages != self.outages_seen:
                    await self.close(code=TRY_AGAIN_LATER, reason=REASON)
                    return
                frames = self.feed.frames_after(self.last_seq)
                if frames is None:  # behind the shared window: replay from the database
                    rows = await database_sync_to_async(encoded_frames_after)(
                        self.run_id, self.last_seq, BATCH
                    )
                    for seq, text in rows:
                        await self.send(text_data=text)
                        self.last_seq = seq
                    if not rows:
                        await self.wakeup.wait()
                    continue
                for seq, text in frames:
                    await self.send(text_data=text)
                    self.last_seq = seq
                if not frames:
                    await self.wakeup.wait()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if is_infrastructure_error(exc):
                await self.close(code=TRY_AGAIN_LATER, reason=REASON)
                return
            log.exception("run stream %s failed", self.run_id)
            await self.close(code=1011)
