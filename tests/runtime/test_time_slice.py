"""AGENTRUNS_SLICE_SECONDS: 0 by default, a run in flight is never cut into slices (it holds no
thread, so a time slice only costs); set,
a run executing that long goes back to the queue at its next boundary (engine/executor.py,
`SliceState.ends_at`)."""

from __future__ import annotations

import pytest

from agentruns.conf import conf
from agentruns.models import RunEvent, RunStatus
from tests.helpers import advance, script_run

pytestmark = pytest.mark.django_db(transaction=True)

TURNS = [{"calls": [["t_echo", {"text": str(n)}]]} for n in range(4)] + [{"text": "done"}]


def yields(run) -> int:
    return RunEvent.objects.filter(
        run=run, type="run.status", data__status="queued", data__reason="time slice"
    ).count()


def test_by_default_a_run_is_never_sliced():
    assert conf.SLICE_SECONDS == 0
    run = advance(script_run(TURNS))
    assert run.status == RunStatus.SUCCEEDED  # one slice, whatever it took
    assert yields(run) == 0


def test_a_slice_ends_at_its_time_and_the_run_goes_back_to_the_queue(settings):
    settings.AGENTRUNS_SLICE_SECONDS = 0.000001
    run = advance(script_run(TURNS))
    assert run.status == RunStatus.QUEUED and yields(run) == 1
    settings.AGENTRUNS_SLICE_SECONDS = 0
    run = advance(run)  # the next slice replays what was done and goes on
    assert run.status == RunStatus.SUCCEEDED
