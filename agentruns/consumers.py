"""`ws/runs/<run_id>/?after=<seq>`: replay from the database, then tail (DESIGN.md 5).

Channel-layer messages are only nudges. One sender task reads the database for `seq > last sent`
whenever it is nudged or its poll interval passes, so a dropped nudge costs latency, never data,
and frames leave in seq order exactly once per connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from .events import run_group
from .fragments import frame_for
from .models import TERMINAL_RUN_STATUSES, Run, RunEvent

log = logging.getLogger(__name__)

BATCH = 500

# close codes: 4401 not authenticated, 4403 forbidden, 4404 no such run, 4400 bad request
REFUSALS = {4400, 4401, 4403, 4404}


class RunStreamConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        self.group = None
        self.sender: asyncio.Task | None = None
        self.wakeup = asyncio.Event()
        await self.accept()
        user = self.scope.get("user")
        if self.scope.get("auth_error") or user is None or not user.is_authenticated:
            await self.close(code=4401, reason=self.scope.get("auth_error") or "login required")
            return
        if not await database_sync_to_async(user.has_perm)("agentruns.view_run"):
            await self.close(code=4403, reason="permission agentruns.view_run required")
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            self.last_seq = int(query.get("after", ["0"])[0] or 0)
        except ValueError:
            await self.close(code=4400, reason="after must be an integer")
            return
        if not await database_sync_to_async(Run.objects.filter(id=self.run_id).exists)():
            await self.close(code=4404, reason="no such run")
            return
        self.group = run_group(self.run_id)
        # subscribe before the first read, so nothing committed in between is missed
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.sender = asyncio.create_task(self.pump())

    async def disconnect(self, code: int) -> None:
        if self.sender is not None:
            self.sender.cancel()
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None) -> None:
        # clients may send {"type": "ping"}; anything else is ignored
        if text_data and '"ping"' in text_data:
            await self.send(text_data=json.dumps({"type": "pong", "seq": self.last_seq}))

    async def run_nudge(self, message: dict) -> None:
        self.wakeup.set()

    async def pump(self) -> None:
        poll = float(settings.AGENTRUNS_STREAM_POLL_SECONDS)
        try:
            while True:
                self.wakeup.clear()
                frames = await self.read_frames()
                for frame in frames:
                    await self.send(text_data=json.dumps(frame))
                    self.last_seq = frame["seq"]
                if len(frames) == BATCH:
                    continue
                try:
                    await asyncio.wait_for(self.wakeup.wait(), timeout=poll)
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("run stream %s failed", self.run_id)
            await self.close(code=1011)

    @database_sync_to_async
    def read_frames(self) -> list[dict]:
        events = list(
            RunEvent.objects.filter(run_id=self.run_id, seq__gt=self.last_seq).order_by("seq")[:BATCH]
        )
        return [frame_for(e) for e in events]


def is_terminal_status(status: str) -> bool:
    return status in TERMINAL_RUN_STATUSES
