"""The model text a run streamed, rebuilt from its events exactly as the stream client does.

Text per (step, attempt); an attempt is dropped when a `model.superseded` event names it or when
a newer attempt of the same step starts streaming. Bounded by the run's `last_seq` read with the
page, so the first render and the socket (`after=last_seq`) meet without a gap or a doubled delta.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from agentruns.models import RunEvent
from agentruns.runtime.events import EventType


@dataclass
class Turn:
    step: int
    attempt: int
    text: str


def live_turns(run_id: uuid.UUID | str, upto_seq: int) -> list[Turn]:
    """The model text in events 1..upto_seq, per (step, attempt), minus dropped attempts."""
    turns: dict[tuple[int, int], list[str]] = {}
    dropped: set[tuple[int, int]] = set()
    newest: dict[int, int] = {}  # step -> newest attempt seen streaming
    rows = (
        RunEvent.objects.filter(
            run_id=run_id,
            seq__lte=upto_seq,
            type__in=[EventType.MODEL_DELTA, EventType.MODEL_SUPERSEDED],
        )
        .order_by("seq")
        .values_list("type", "data")
    )
    for etype, data in rows:
        key = (int(data.get("step", 0)), int(data.get("attempt", 0)))
        if etype == EventType.MODEL_SUPERSEDED:
            dropped.add(key)
            continue
        if key in dropped:
            continue
        if key[1] > newest.get(key[0], 0):
            for older in range(1, key[1]):
                dropped.add((key[0], older))
            newest[key[0]] = key[1]
        turns.setdefault(key, []).append(data.get("text", ""))
    return [
        Turn(step=k[0], attempt=k[1], text="".join(parts))
        for k, parts in turns.items()
        if k not in dropped
    ]
