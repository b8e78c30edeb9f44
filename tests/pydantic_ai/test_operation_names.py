"""The persisted names of a Pydantic AI agent's durable operations, pinned (as pydantic-ai pins
its own): a run recorded under these names must replay after a deploy, so a change of naming is
a migration, not a refactor (docs/engine-design.md, "The journal")."""

from __future__ import annotations

import pytest

from agentruns.models import JournalEntry, RunStatus
from agentruns.runtime.engine.durability import StepBackend
from tests.helpers import advance
from tests.pydantic_ai import agents  # noqa: F401  (registers the test agents)
from tests.pydantic_ai.kit import start

pytestmark = pytest.mark.django_db


def test_the_operations_of_a_run_keep_their_persisted_names(monkeypatch):
    seen: list[str] = []
    original = StepBackend.execute

    async def spy(self, *, name, **kwargs):
        seen.append(name)
        return await original(self, name=name, **kwargs)

    monkeypatch.setattr(StepBackend, "execute", spy)
    run = advance(start("pa-shop", ("pa_lookup", {"order_id": "ORD-7"}), say="Found it:"))
    assert run.status == RunStatus.SUCCEEDED, run.error
    # model requests reach the backend by their persisted name; tool calls are found again by
    # their call id (the tool step the model step planned), so no journal entry is named here
    assert seen == ["pa-shop__model.request", "pa-shop__model.request"]
    assert not JournalEntry.objects.filter(run=run).exists()
