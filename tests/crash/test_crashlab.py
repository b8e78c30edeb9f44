"""The crash lab end to end on PostgreSQL: real workers, real SIGKILLs, the gateway's ledger."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.crash, pytest.mark.timeout(900)]


def test_crashlab_durable_group_refunds_once_naive_group_duplicates(tmp_path, capsys):
    call_command("crashlab", "--json", "--workdir", str(tmp_path / "lab"), "--timeout", "120")
    report = json.loads(capsys.readouterr().out)
    rows = {(r["group"], r["fault"]): r for r in report["rows"]}
    assert report["ok"], report["problems"]
    for fault in (
        "before_refund_call",
        "after_remote_success",
        "after_persisted",
        "while_reply_streams",
    ):
        durable = rows[("B", fault)]
        assert durable["refunds_executed"] == 1 and durable["final_status"] == "succeeded"
    # the refund step was interrupted mid-call: a second attempt with the same key
    assert rows[("B", "after_remote_success")]["attempt"] == 2
    assert rows[("B", "before_refund_call")]["attempt"] == 2
    # the naive design refunds twice exactly where a crash follows the remote success
    assert rows[("A", "before_refund_call")]["refunds_executed"] == 1
    for fault in ("after_remote_success", "after_persisted", "while_reply_streams"):
        assert rows[("A", fault)]["refunds_executed"] == 2
