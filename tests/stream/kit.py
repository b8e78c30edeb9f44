"""Shared helpers for the stream tests: runs with hand-written events, frame checks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from django.db import transaction
from django.db.models import F

from agentruns.models import Run, RunEvent
from agentruns.runtime.store import get_store
from tests.procs import start_web, start_worker
from tests.providers.kit import API_KEY


def make_run(agent: str = "script") -> Run:
    return Run.objects.create(agent=agent, input={}, status="running")


def add_events(run_id: uuid.UUID, specs: list[tuple[str, dict]]) -> int:
    """Append events the way every writer does: seqs + nudge on commit."""
    with transaction.atomic():
        return get_store().append(run_id, specs)


def add_events_without_nudge(run_id: uuid.UUID, specs: list[tuple[str, dict]]) -> int:
    """Commit events but never nudge: stands for a nudge lost on the way (or another process)."""
    with transaction.atomic():
        Run.objects.filter(id=run_id).update(last_seq=F("last_seq") + len(specs))
        last = Run.objects.get(id=run_id).last_seq
        first = last - len(specs) + 1
        RunEvent.objects.bulk_create(
            RunEvent(run_id=run_id, seq=first + i, type=t, data=d) for i, (t, d) in enumerate(specs)
        )
    return last


def deltas(step: int, texts: list[str], attempt: int = 1) -> list[tuple[str, dict]]:
    return [("model.delta", {"step": step, "attempt": attempt, "text": t}) for t in texts]


def expected_text(run_id: uuid.UUID) -> str:
    """The run's model text by the client's rules, from the database (selectors.live_turns)."""
    from agentruns.selectors import live_turns

    run = Run.objects.get(id=run_id)
    return "".join(t.text for t in live_turns(run.id, run.last_seq))


def text_from_frames(frames: list[dict]) -> str:
    """Apply frames the way agentruns/static/agentruns/runstream.js does and return the visible model text."""
    turns: dict[tuple[int, int], str] = {}
    dropped: set[tuple[int, int]] = set()
    newest: dict[int, int] = {}
    for f in frames:
        d = f["data"]
        if f["type"] == "model.superseded":
            dropped.add((d["step"], d["attempt"]))
            turns.pop((d["step"], d["attempt"]), None)
        elif f["type"] == "model.delta":
            key = (d["step"], d["attempt"])
            if key in dropped:
                continue
            if key[1] > newest.get(key[0], 0):
                for older in range(1, key[1]):
                    dropped.add((key[0], older))
                    turns.pop((key[0], older), None)
                newest[key[0]] = key[1]
            turns[key] = turns.get(key, "") + d["text"]
    return "".join(turns.values())


@contextmanager
def served_by_fake_openai(tmp_path: Path, fake_url: str) -> Iterator[str]:
    """daphne and a qcluster worker on the test database, the test agents' model the fake
    OpenAI server at `fake_url`: yields the web server's URL, stops both after."""
    env = {
        "AGENTRUNS_AGENT_MODULES": "tests.testkit",
        "AGENTRUNS_MODEL": "openai:fake-model",
        "OPENAI_BASE_URL": fake_url,
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_TIMEOUT_SECONDS": 30,
    }
    web, url = start_web(tmp_path, **env)
    worker = start_worker(tmp_path, **env)
    try:
        yield url
    finally:
        worker.stop()
        web.stop()
