"""A tick's nudges through a real Redis (channels_redis): the groups nobody listens to cost one
pipelined EXISTS each instead of `group_send`'s two round trips, and every listened group still
gets its own message (store/nudges.py)."""

from __future__ import annotations

import asyncio

from channels_redis.core import RedisChannelLayer

from agentruns.runtime.store import nudges


def _calls(server, command: str) -> int:
    return server.client().info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_a_ticks_nudges_skip_the_groups_nobody_listens_to(redis_server):
    layer = RedisChannelLayer(hosts=[redis_server.url])
    unwatched = [f"run.unwatched{i}" for i in range(50)]

    async def scenario() -> tuple[list[dict], int, int]:
        viewers = [await layer.new_channel() for _ in range(2)]
        await layer.group_add("run.a", viewers[0])
        await layer.group_add("run.b", viewers[1])
        sends = [("run.a", {"type": "run.nudge", "seq": 3})]
        sends += [(group, {"type": "run.nudge", "seq": 1}) for group in unwatched]
        sends.append(("run.b", {"type": "run.nudge", "seq": 7}))
        listed_before, asked_before = _calls(redis_server, "zrange"), _calls(redis_server, "exists")
        await nudges._group_send_all(layer, sends)
        listed = _calls(redis_server, "zrange") - listed_before
        asked = _calls(redis_server, "exists") - asked_before
        got = [await asyncio.wait_for(layer.receive(viewer), timeout=5) for viewer in viewers]
        await layer.close_pools()
        return got, listed, asked

    got, listed, asked = asyncio.run(scenario())
    assert got == [{"type": "run.nudge", "seq": 3}, {"type": "run.nudge", "seq": 7}]
    assert listed == 2  # group_send listed the members of the two watched groups only
    assert asked == 52  # one EXISTS per group, in one pipeline
