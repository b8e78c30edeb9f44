"""The run page for support staff (issue 34, item 6): the conversation first (the customer's
message, the agent's words, the reply sent), the input as fields, the engineering detail one
click away; actions for who may take them and who can for the others; attempts counted from
the last retry; a step's "running" event without the previous attempt's error."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agentruns.models import RunEvent, RunStatus, Step
from agentruns.services import retry_run, start_run
from support.models import OutboxMessage
from tests import testkit
from tests.helpers import advance
from tests.testkit import OPS_AGENT, failed_shipping_run, script_run

pytestmark = pytest.mark.django_db


def page_of(user, run) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/runs/{run.id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_conversation_comes_first_and_the_engineering_detail_one_click_away(
    seeded, django_user_model
):
    viewer = django_user_model.objects.get(username="viewer")
    # a trainee's run: it may not refund, so it hands over and replies (no gateway needed)
    trainee = django_user_model.objects.get(username="trainee")
    message = "My <b>kettle</b> arrived broken, refund $12 please"
    run_input = {"order_id": "ORD-1008", "ticket_id": "T-1008", "message": message}
    run = advance(start_run("refund", run_input, user=trainee).run)
    assert run.status == RunStatus.SUCCEEDED
    page = page_of(viewer, run)
    reply = OutboxMessage.objects.get(run_id=run.id).body
    conversation = page.index('id="customer-message"')
    # in reading order: the customer, the agent's words, the reply sent, the outcome; then the
    # engineering detail (steps, keys, timeline, events) inside a closed <details>
    positions = [
        page.index("My &lt;b&gt;kettle&lt;/b&gt; arrived broken"),
        page.index('id="live-text"'),
        page.index('class="msg-text reply-text">' + reply.replace("'", "&#x27;")),
        page.index('id="run-output"'),
        page.index('<details class="engineering" id="engineering">'),
        page.index('id="steps"'),
        page.index('id="events"'),
    ]
    assert conversation < positions[0] and positions == sorted(positions)
    assert ">sent</span>" in page[positions[2] - 300 : positions[2]]
    # the input as fields, not a Python dict; the message is not repeated there
    fields = page[page.index('id="run-input"') :]
    fields = fields[: fields.index("</dl>")]
    assert '<dt data-name="order_id">Order</dt><dd><code>ORD-1008</code></dd>' in fields
    assert '<dt data-name="ticket_id">Ticket</dt><dd><code>T-1008</code></dd>' in fields
    assert "kettle" not in fields and "{&#x27;order_id" not in page
    assert "<b>kettle</b>" not in page  # the customer's words are text


def test_actions_for_who_may_take_them_and_who_can_for_the_others(seeded, operator):
    run = failed_shipping_run()
    approver = type(operator).objects.get(username="approver")
    page = page_of(approver, run)
    assert 'class="act-retry"' not in page and "Mark step resolved" not in page
    assert (
        "Only operators can retry this run or mark its failed step resolved: ask an administrator."
        in page
    )
    ops = Group.objects.create(name="on-call")
    ops.permissions.add(Permission.objects.get(codename="operate_run"))
    assert "ask someone in on-call, or an administrator." in page_of(approver, run)
    page = page_of(operator, run)
    assert 'class="act-retry"' in page and "Only operators" not in page
    # a running run: who may stop it (its starter, an operator), and a Stop for those only
    queued = script_run([{"text": "hi"}])
    page = page_of(approver, queued)
    assert "Only the person who started it or an operator can stop this run" in page
    assert 'class="act-stop"' not in page and "Cancel run" not in page
    page = page_of(operator, queued)
    assert 'class="act-stop"' in page and "Stop ends the run now" in page
    assert "Only the person" not in page and "Cancel run" not in page  # one Stop, explained
    # a finished run needs nobody
    done = advance(queued)
    assert "Only operators" not in page_of(approver, done)


def attempts_cell(page: str, step: Step) -> str:
    row = page[page.index(f'id="step-{step.index}"') :]
    return re.search(r'<td class="num attempts-count">(.*?)</td>', row).group(1)


def test_attempts_count_from_the_retry_and_events_carry_their_own_error(seeded, operator):
    testkit.FAILS["ops_ship"] = 2  # its retry policy allows 2 attempts: the run fails
    run = advance(
        script_run([{"calls": [["ops_ship", {"parcel": "P-9"}]]}, {"text": "ok"}], agent=OPS_AGENT)
    )
    assert run.status == RunStatus.FAILED
    retry_run(run.id, user=operator)
    step = Step.objects.get(run=run, tool="ops_ship")
    assert (step.attempts, step.retry_base) == (2, 2)
    cell = attempts_cell(page_of(operator, run), step)
    assert cell.startswith("0<small> of 2</small>") and "2 in all" in cell  # was "2 of 2"

    testkit.FAILS["ops_ship"] = 1  # attempt 3 fails again, attempt 4 succeeds
    assert advance(run).status == RunStatus.SUCCEEDED
    cell = attempts_cell(page_of(operator, run), step)
    assert cell.startswith("2<small> of 2</small>") and "4 in all" in cell  # was "4 of 2"

    started = [
        e.data
        for e in RunEvent.objects.filter(run=run, type="step.started").order_by("seq")
        if e.data.get("tool") == "ops_ship"
    ]
    assert [e["attempts"] for e in started] == [1, 2, 3, 4]
    assert [e["error"] for e in started] == ["", "", "", ""]  # each attempt's own: none yet
    failed = RunEvent.objects.filter(run=run, type__in=["step.retry_scheduled", "step.failed"])
    assert all("carrier timeout" in e.data["error"] for e in failed if e.data.get("tool"))


def test_a_stop_that_would_withdraw_a_call_asks_first(seeded, operator):
    """Stopping a run that waits for an approver withdraws the call: the page's form says so
    and sends `withdraw`; a stop without it (a page from before the run parked, no script) is
    answered with the confirmation, listing the call in words, and stops nothing. Confirmed,
    the run ends stopped and its call reads "withdrawn"."""
    run = advance(script_run([{"calls": [["t_pay", {"amount": 500}]]}], agent=OPS_AGENT))
    assert run.status == RunStatus.WAITING
    client = Client()
    client.force_login(operator)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="stop-confirm"' in page and 'name="withdraw" value="1"' in page
    asked = client.post(f"/runs/{run.id}/stop/", {"reason": "not needed"})
    assert asked.status_code == 200
    confirm = asked.content.decode()
    assert "Stop this run?" in confirm and "<li>T pay</li>" in confirm
    assert 'value="not needed"' in confirm
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    done = client.post(f"/runs/{run.id}/stop/", {"withdraw": "1", "reason": "not needed"})
    assert done.status_code == 302
    run.refresh_from_db()
    assert (run.status, run.stop_reason) == (RunStatus.CANCELLED, "stopped")
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Stopped by operator: not needed" in page
    assert '<span class="chip s-withdrawn">withdrawn</span>' in page
    assert "The run was stopped by operator" in page
    # who stopped it is read once for the banner and the run's notes
    asked_to_stop = [q for q in queries.captured_queries if "'run.cancel_requested'" in q["sql"]]
    assert len(asked_to_stop) == 1, asked_to_stop
    # a run with nothing waiting for a person stops at once
    queued = script_run([{"text": "hi"}])
    assert client.post(f"/runs/{queued.id}/stop/").status_code == 302
