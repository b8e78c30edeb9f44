"""The AI SDK UI message stream over SSE: chunks from `startIndex` on, then the run live.

Each response folds the run's events from seq 1 (`ui_chunks.UIChunks`) and sends the chunks
whose index is at least `start_index`, then follows the run on the process's shared `RunFeed`
(the WebSocket stream's: one channel-layer subscription per process and run, plus its
database poll), as one of its `watchers`, re-reading the database on every wakeup, in the event
loop: an open stream holds no thread while it waits (`http_handler.py`). Nothing is buffered
anywhere but the events table, so a web server restart loses nothing: the client reconnects
with the count of chunks it has and gets exactly the rest.

The response ends (`data: [DONE]`) once the last chunk so far is a `finish`, i.e. the run has
parked or ended; a comment line (`: keepalive`) goes out when nothing happened for a while, so
proxies keep the connection and a dead client is noticed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from channels.db import database_sync_to_async
from django.http import StreamingHttpResponse

from agentruns.models import Run, RunEvent
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.stream.consumer import close_feed_if_idle, open_feed
from agentruns.stream.ui_chunks import UIChunks, encode_chunk

log = logging.getLogger(__name__)

BATCH = 500  # events per database read
OUTAGE_PATIENCE_SECONDS = 30.0  # how long a stream waits out database faults before it ends
READ_THREADS = 4  # reads of every SSE stream of the process (each a short query)
KEEPALIVE_SECONDS = 15.0
DONE = "data: [DONE]\n\n"
KEEPALIVE = ": keepalive\n\n"
HEADERS = {
    "Cache-Control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}


def new_fold(run: Run) -> UIChunks:
    return UIChunks(str(run.id), run.redacted_fields)


def fold_more(fold: UIChunks, start_index: int, limit: int = BATCH) -> tuple[list[str], bool]:
    """Feed the events after `fold.seq` (up to the first hole: seqs commit in order, so a hole
    is a read racing a commit and closes on the next read); return the frames of the chunks at
    `start_index` or later, and whether more events may be waiting (a full batch)."""
    rows = list(
        RunEvent.objects.filter(run_id=fold.run_id, seq__gt=fold.seq)
        .order_by("seq")
        .values_list("seq", "type", "data")[:limit]
    )
    frames: list[str] = []
    for seq, etype, data in rows:
        if seq != fold.seq + 1:
            log.warning("run %s: event %s not visible yet after %s", fold.run_id, seq, fold.seq)
            return frames, False
        first = fold.count
        for offset, chunk in enumerate(fold.feed(seq, etype, data)):
            if first + offset >= start_index:
                frames.append(encode_chunk(chunk))
    return frames, len(rows) == limit


# The streams' reads run on threads of their own, a few for the whole process: not on a
# request's thread (an open stream would hold one: http_handler.py), and not on the loop's
# default executor, where Django logs every 4xx and 5xx answer (a read waiting out a database
# fault there held up the logging of a burst of 429s, and with it their connections)
READS = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="sse-read")
READ = database_sync_to_async(fold_more, thread_sensitive=False, executor=READS)


def chunks_until_now(run: Run) -> UIChunks:
    """The fold over every event committed so far (where a continuation starts)."""
    fold = new_fold(run)
    while fold_more(fold, start_index=1 << 62)[1]:
        pass
    return fold


async def read_through_weather(fold: UIChunks, start_index: int) -> tuple[list[str], bool]:
    """`fold_more` on the streams' own threads (READS; not the request's own thread:
    http_handler.py), waiting out database faults (a pool wait that timed out under a burst, a
    restart) for up to OUTAGE_PATIENCE_SECONDS: weather, not the end of the stream. A failed
    read folded nothing, so it is simply read again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + OUTAGE_PATIENCE_SECONDS
    while True:
        try:
            return await READ(fold, start_index)
        except Exception as exc:
            if not is_infrastructure_error(exc) or loop.time() >= deadline:
                raise
            log.info("run %s: stream read failed (%s); reading again", fold.run_id, exc)
        await asyncio.sleep(1.0)


async def follow(run: Run, start_index: int) -> AsyncIterator[str]:
    """The SSE body: frames from `start_index`, live until the run parks or ends."""
    run_id = str(run.id)
    fold = new_fold(run)
    # the run as the view read it: the feed starts there without a read of its own (an older
    # head only makes the feed's first read find more)
    feed = await open_feed(run_id, run.last_seq)
    wakeup = asyncio.Event()
    feed.watchers.add(wakeup)
    try:
        while True:
            wakeup.clear()
            frames, more = await read_through_weather(fold, start_index)
            for frame in frames:
                yield frame
            if more:
                continue
            if fold.ended:
                yield DONE
                return
            try:
                await asyncio.wait_for(wakeup.wait(), timeout=KEEPALIVE_SECONDS)
            except TimeoutError:
                yield KEEPALIVE
    finally:
        feed.watchers.discard(wakeup)
        await close_feed_if_idle(run_id, feed)


def ui_message_stream_response(run: Run, start_index: int) -> StreamingHttpResponse:
    response = StreamingHttpResponse(follow(run, start_index), content_type="text/event-stream")
    for name, value in HEADERS.items():
        response[name] = value
    response["x-run-id"] = str(run.id)
    return response
