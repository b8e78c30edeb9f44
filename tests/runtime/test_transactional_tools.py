"""Transactional tools: their writes commit with the step's result, or not at all."""

from __future__ import annotations

import pytest

from agentruns.models import RunEvent
from support.models import GatewayRefund
from tests import testkit
from tests.helpers import advance, script_run, steps

pytestmark = pytest.mark.django_db


def _ledger_rows() -> int:
    return GatewayRefund.objects.filter(order_id="ORD-TX").count()


def test_transactional_tool_runs_inside_the_model_commit():
    run = advance(script_run([{"calls": [["t_tx", {"amount": 5}]]}, {"text": "ok"}]))
    assert run.status == "succeeded"
    step = steps(run)[1]
    assert step.status == "succeeded" and step.attempts == 1 and step.result == {"written": 5}
    assert _ledger_rows() == 1
    assert not RunEvent.objects.filter(run=run, type="step.started", data__step=1).exists()


def test_transactional_tool_failure_undoes_its_writes():
    testkit.FAILS["t_tx"] = 2  # the eager try and the first attempt fail after writing
    run = advance(script_run([{"calls": [["t_tx", {"amount": 5}]]}, {"text": "ok"}]))
    assert run.status == "succeeded", run.error
    assert len(testkit.CALLS["t_tx"]) == 3
    assert _ledger_rows() == 1  # only the write of the call that succeeded is committed
    failed = steps(run)[1].attempt_rows.get(number=1)
    assert failed.outcome == "retrying" and "failed after writing" in failed.traceback


def test_transactional_tool_after_a_side_effect_commits_with_its_result():
    run = advance(
        script_run(
            [{"calls": [["t_charge", {"amount": 1}], ["t_tx", {"amount": 7}]]}, {"text": "ok"}]
        )
    )
    assert run.status == "succeeded", run.error
    tx = steps(run)[2]
    assert tx.tool == "t_tx" and tx.status == "succeeded" and tx.attempts == 1
    assert _ledger_rows() == 1
