"""The runs list (filters, search, keyset pages, constant queries) and the run detail timeline."""

from __future__ import annotations

import html
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.runtime.values.redaction import MASK
from agentruns.selectors import runs as selectors
from agentruns.selectors.run_list import PAGE_SIZE, RunFilters, id_prefix_range, run_page
from tests import testkit
from tests.helpers import advance, script_run, steps
from tests.testkit import OPS_AGENT

pytestmark = pytest.mark.django_db


def make_runs(
    n: int,
    *,
    start: int = 0,
    status: str = RunStatus.SUCCEEDED,
    agent: str = "ops-script",
    age: timedelta = timedelta(0),
) -> list[Run]:
    """Rows straight into the table (the list only reads them), newest first by index."""
    now = timezone.now() - age
    rows = [
        Run(
            agent=agent,
            status=status,
            input={},
            search_text=f"ORD-{5000 + i} T-{5000 + i}",
            error="boom" if status == RunStatus.FAILED else "",
        )
        for i in range(start, start + n)
    ]
    Run.objects.bulk_create(rows)
    for i, run in enumerate(rows):  # auto_now_add ignores values given to bulk_create
        Run.objects.filter(id=run.id).update(created_at=now - timedelta(seconds=i))
    return rows


def row_ids(response) -> list[str]:
    return re.findall(r'data-run-id="([0-9a-f-]{36})"', response.content.decode())


def page_link(response, rel: str) -> str | None:
    match = re.search(rf'rel="{rel}" href="\?([^"]+)"', response.content.decode())
    return html.unescape(match.group(1)) if match else None


# ------------------------------------------------------------------ constant queries
def list_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize(
    "query",
    ["", "?status=failed", "?agent=ops-script&age=24h", "?q=ORD-5003", "?q=T-5004&status=failed"],
)
def test_list_query_count_is_constant(client, operator, query):
    client.force_login(operator)
    make_runs(5, status=RunStatus.FAILED)
    make_runs(5, start=5)
    small = list_queries(client, "/runs/" + query)
    make_runs(95, start=10, status=RunStatus.FAILED)
    make_runs(95, start=105)
    large = list_queries(client, "/runs/" + query)
    assert Run.objects.count() == 200
    assert small == large
    # session + user + the page's permission check (the user's and their groups' permissions,
    # read once per request) + navigation (one query for every count) + the page itself
    assert 3 <= large <= 7


def test_deep_page_costs_the_same_queries(client, operator):
    client.force_login(operator)
    make_runs(3 * PAGE_SIZE + 7)
    first = client.get("/runs/")
    second_url = "/runs/?" + page_link(first, "next")
    third_url = "/runs/?" + page_link(client.get(second_url), "next")
    assert list_queries(client, "/runs/") == list_queries(client, third_url)


# ------------------------------------------------------------------ keyset pagination
def test_pages_walk_every_run_once_forward_and_back(client, operator):
    client.force_login(operator)
    runs = make_runs(2 * PAGE_SIZE + 13)
    # a burst of runs created in the same microsecond: the id breaks the tie
    tied = make_runs(7, start=900)
    same = timezone.now() - timedelta(seconds=60)
    Run.objects.filter(id__in=[r.id for r in tied]).update(created_at=same)
    expected = [
        str(i) for i in Run.objects.order_by("-created_at", "-id").values_list("id", flat=True)
    ]
    assert len(expected) == len(runs) + len(tied)

    seen, pages, url = [], [], "/runs/"
    while url:
        response = client.get(url)
        ids = row_ids(response)
        assert 0 < len(ids) <= PAGE_SIZE
        pages.append((url, ids))
        seen += ids
        nxt = page_link(response, "next")
        url = "/runs/?" + nxt if nxt else None
    assert seen == expected  # every run exactly once, newest first
    assert len(pages) == 3

    # and back: "newer" from the last page gives exactly the page before it
    last_response = client.get(pages[-1][0])
    back = client.get("/runs/?" + page_link(last_response, "prev"))
    assert row_ids(back) == pages[-2][1]
    assert page_link(client.get("/runs/"), "prev") is None


def test_pagination_keeps_the_filters(client, operator):
    client.force_login(operator)
    make_runs(PAGE_SIZE + 5, status=RunStatus.FAILED)
    make_runs(30, start=500)
    first = client.get("/runs/?status=failed")
    nxt = page_link(first, "next")
    assert "status=failed" in nxt
    second = client.get("/runs/?" + nxt)
    assert len(row_ids(first)) == PAGE_SIZE and len(row_ids(second)) == 5
    assert set(row_ids(second)).isdisjoint(row_ids(first))


def test_a_garbled_cursor_is_the_first_page(client, operator):
    client.force_login(operator)
    make_runs(3)
    assert len(row_ids(client.get("/runs/?older=%%%not-a-cursor"))) == 3


# ------------------------------------------------------------------ filters and search
def test_filters_by_status_agent_and_age(client, operator):
    client.force_login(operator)
    failed = make_runs(3, status=RunStatus.FAILED)
    waiting = make_runs(2, start=10, status=RunStatus.WAITING)
    other = make_runs(2, start=20, agent="ops-other")
    old = make_runs(2, start=30, age=timedelta(days=3))
    ids = lambda runs: {str(r.id) for r in runs}  # noqa: E731

    assert set(row_ids(client.get("/runs/?status=failed"))) == ids(failed)
    assert set(row_ids(client.get("/runs/?status=waiting"))) == ids(waiting)
    assert set(row_ids(client.get("/runs/?agent=ops-other"))) == ids(other)
    recent = set(row_ids(client.get("/runs/?age=24h")))
    assert ids(old).isdisjoint(recent) and ids(failed) <= recent
    assert set(row_ids(client.get("/runs/?age=7d"))) >= ids(old)
    # an unknown status is ignored, not an error
    assert len(row_ids(client.get("/runs/?status=bogus"))) == 9
    # htmx asks for the rows only
    partial = client.get("/runs/?status=failed", HTTP_HX_REQUEST="true")
    assert b"<h1>" not in partial.content and set(row_ids(partial)) == ids(failed)


def test_search_by_order_ticket_and_run_id(client, operator):
    client.force_login(operator)
    runs = make_runs(20)
    target = runs[7]  # ORD-5007 T-5007
    for q in ("ORD-5007", "T-5007", "ord-5007", "t-5007"):
        assert row_ids(client.get("/runs/", {"q": q})) == [str(target.id)], q
    assert set(row_ids(client.get("/runs/", {"q": "ORD-501"}))) == {str(r.id) for r in runs[10:20]}
    text = str(target.id)
    for q in (text, text[:8], text[:13], text.replace("-", "")[:12], text.upper()[:10]):
        assert str(target.id) in row_ids(client.get("/runs/", {"q": q})), q
    assert row_ids(client.get("/runs/", {"q": "ORD-9999"})) == []
    assert b"No runs match" in client.get("/runs/", {"q": "nothing-like-this"}).content


def test_id_prefix_is_a_primary_key_range():
    low, high = id_prefix_range("1a2b3c4d-5e")
    assert low == uuid.UUID("1a2b3c4d-5e00-0000-0000-000000000000")
    assert high == uuid.UUID("1a2b3c4d-5eff-ffff-ffff-ffffffffffff")
    assert id_prefix_range("ORD-1001") is None
    page = run_page(RunFilters(q="zz"))
    assert page.items == []


# ------------------------------------------------------------------ navigation counts
def test_navigation_counts_per_status(client, operator, monkeypatch):
    client.force_login(operator)
    make_runs(3, status=RunStatus.FAILED)
    make_runs(2, start=10, status=RunStatus.WAITING)
    counts = selectors.nav_counts()
    assert counts["runs"] == {"failed": 3, "waiting": 2, "running": 0, "queued": 0}
    assert counts["pending_approvals"] == 0
    monkeypatch.setattr(selectors, "NAV_COUNT_CAP", 3)
    assert selectors.nav_counts()["runs"]["failed"] == "2+"
    monkeypatch.undo()
    page = client.get("/runs/").content.decode()
    assert re.search(r'status=failed">Failed <span class="count s-failed">3</span>', page)


# ------------------------------------------------------------------ the run detail timeline
def test_detail_shows_attempts_policy_redaction_and_svg(client, operator):
    client.force_login(operator)
    testkit.FAILS["t_charge"] = 3
    run = advance(
        script_run(
            [
                {
                    "text": "looking up",
                    "calls": [
                        ["ops_lookup", {"customer": "ann", "api_key": "hunter2-ann"}],
                        ["t_charge", {"amount": 4}],
                    ],
                }
            ],
            agent=OPS_AGENT,
        )
    )
    assert run.status == RunStatus.FAILED
    page = client.get(f"/runs/{run.id}/").content.decode()
    run_steps = steps(run)
    charge = run_steps[2]
    # redacted by the snapshot's list, in the arguments, the result and the model's tool call
    # (the script itself, the run's input, carries the secret: look at the timeline and steps)
    timeline = page[page.index("<h2>Timeline</h2>") :]
    timeline = timeline[: timeline.index("<h2>Events</h2>")]
    assert "hunter2-ann" not in timeline and "ann@example.com" not in timeline
    assert timeline.count(MASK) >= 3
    assert "&quot;customer&quot;: &quot;ann&quot;" in timeline and "gold" in timeline
    # every step, its key, attempts with outcome, worker and error; tracebacks collapsible
    for step in run_steps:
        assert f'id="step-{step.index}"' in page and step.idempotency_key in page
    assert page.count('class="attempt-row o-retrying"') == 2
    assert page.count('class="attempt-row o-failed"') == 1
    assert '<details class="traceback"><summary>traceback</summary>' in page
    assert "RetryableToolError" in page and "temporary outage" in page
    # the retry policy from the snapshot, and model usage
    assert "up to 3 attempts" in page and "RetryableToolError" in page
    assert (
        f"{run_steps[0].prompt_tokens} prompt + {run_steps[0].completion_tokens} completion tokens"
        in page
    )
    # one bar per attempt, coloured by outcome
    attempts_total = sum(s.attempts for s in run_steps)
    assert page.count('<rect class="attempt ') == attempts_total
    assert page.count('class="attempt o-retrying"') == 2
    assert 'class="attempt o-failed"' in page and 'fill="#c53030"' in page
    # the operator's buttons
    assert "Retry from failed step" in page
    assert charge.status == StepStatus.FAILED


def test_detail_shows_the_stop_reason_and_next_retry(client, operator, settings):
    client.force_login(operator)
    settings.AGENTRUNS_DEFAULT_MAX_STEPS = 3
    run = advance(
        script_run([{"calls": [["t_echo", {"text": "x"}]], "loop": True}], agent="script-short")
    )
    assert run.stop_reason == "max_steps"
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'id="stop-reason"' in page and "max_steps" in page

    # a step between automatic attempts (what the engine leaves while it backs off)
    waiting = script_run([{"calls": [["t_charge", {"amount": 1}]]}], agent=OPS_AGENT)
    when = timezone.now() + timedelta(seconds=42)
    step = Step.objects.create(
        run=waiting,
        index=0,
        kind="tool",
        tool="t_charge",
        arguments={"amount": 1},
        idempotency_key=f"k-{uuid.uuid4().hex}",
        status=StepStatus.PENDING,
        attempts=1,
        next_attempt_at=when,
        error="RetryableToolError: temporary outage",
    )
    page = client.get(f"/runs/{waiting.id}/").content.decode()
    assert "next try at" in page and timezone.localtime(when).strftime("%H:%M:%S") in page
    assert "2 automatic attempts left" in page
    assert step.idempotency_key in page


def test_detail_query_count_does_not_grow_with_steps(client, operator):
    client.force_login(operator)
    small = advance(
        script_run([{"calls": [["t_echo", {"text": "a"}]]}, {"text": "done"}], agent=OPS_AGENT)
    )
    calls = [["t_echo", {"text": str(i)}] for i in range(8)]
    big = advance(
        script_run([{"calls": calls}, {"calls": calls}, {"text": "done"}], agent=OPS_AGENT)
    )
    assert Step.objects.filter(run=big).count() > 3 * Step.objects.filter(run=small).count()
    assert list_queries(client, f"/runs/{small.id}/") == list_queries(client, f"/runs/{big.id}/")
