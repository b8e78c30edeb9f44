"""An SSE answer held to a socket's rules: it counts against the stream caps (`slots.py`) and
ends within 2 s of its viewer losing the right to watch (`viewers.py`), even while it waits.

`api/endpoint.py` takes the slot before a streaming view runs (a refusal is a 429 there) and
hands every answer of that view to `held_stream`: a streamed answer keeps the slot until its body
ends however it ends (finished, ended by the watch, the client gone, or never started and
dropped); any other answer gives it back at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

from django.http import HttpResponseBase, StreamingHttpResponse

from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.stream.access.slots import Slot
from agentruns.stream.access.viewers import Ending, Viewer, viewer_of_request, watch
from agentruns.stream.unavailable import REASON

log = logging.getLogger(__name__)


def held_stream(response: HttpResponseBase, request: Any, slot: Slot | None) -> HttpResponseBase:
    """`response` with its body watched and holding `slot` (None: no slot was taken)."""
    if not (isinstance(response, StreamingHttpResponse) and response.is_async):
        if slot is not None:
            slot.release()
        return response
    body = watched_body(response.streaming_content, viewer_of_request(request), slot)
    if slot is not None:
        # a body never started (the client left before the first chunk) runs no `finally`
        weakref.finalize(body, slot.release)
    response.streaming_content = body
    return response


def error_chunk(text: str) -> bytes:
    return f"data: {json.dumps({'type': 'error', 'errorText': text})}\n\n".encode()


def failure_chunk(exc: Exception) -> bytes:
    """How a stream that failed after its headers went out ends: an AI SDK `error` chunk, then
    the end of the response (the client resumes with its chunk count). An exception must not
    leave: daphne would hold the half-sent response open, and stop reaping its applications."""
    if is_infrastructure_error(exc):
        return error_chunk(REASON)
    log.error("stream failed", exc_info=exc)
    return error_chunk("the stream failed; resume it to continue")


async def watched_body(
    chunks: AsyncIterator[bytes], viewer: Viewer | None, slot: Slot | None
) -> AsyncIterator[bytes]:
    """The chunks of `chunks` until they end or the watch ends the viewer's right: then an AI SDK
    `error` chunk naming why, and the end."""
    ended: list[Ending] = []
    lapsed = asyncio.Event()

    def end(ending: Ending) -> None:
        ended.append(ending)
        lapsed.set()

    own = watch()
    if viewer is not None:
        own.add(viewer, end)
    upstream = aiter(chunks)
    stop = asyncio.ensure_future(lapsed.wait())
    following: asyncio.Future | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(upstream))
            await asyncio.wait({following, stop}, return_when=asyncio.FIRST_COMPLETED)
            if following.done():
                try:
                    chunk = following.result()
                except StopAsyncIteration:
                    return
                except Exception as exc:
                    yield failure_chunk(exc)
                    return
                yield chunk
                continue
            following.cancel()  # the stream's own cleanup (leaving the run's feed) runs now
            yield error_chunk(ended[0].reason)
            return
    finally:  # also when the client went away (the server closes this generator)
        stop.cancel()
        if following is not None and not following.done():
            following.cancel()
        if viewer is not None:
            own.discard(viewer, end)
        if slot is not None:
            slot.release()
