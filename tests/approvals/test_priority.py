"""The inbox orders by priority, then age (issue 30): an item carries its run's priority from
the moment it opens; the inbox page (walked page by page both ways), the items the poll
refreshes and the API list show the highest priority first and the newest first within one."""

from __future__ import annotations

import re

import pytest

from agentruns.models import RunStatus
from agentruns.services import start_run
from approvals.models import Approval, ApprovalKind
from tests.conftest import ApiClient
from tests.helpers import advance

from .kit import bulk_pending, login, refund_script

pytestmark = pytest.mark.django_db

INBOX = "/approvals/"


def shown(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'id="approval-(\d+)"', html)]


def test_an_item_carries_its_runs_priority():
    run = start_run("ap-script", {"script": refund_script(), "message": "refund"}, priority=5).run
    assert advance(run).status == RunStatus.WAITING
    approval = Approval.objects.get(run=run, kind=ApprovalKind.APPROVAL)
    assert approval.priority == 5


def test_the_inbox_and_the_api_list_the_highest_priority_first_then_the_newest(client, lead):
    items = bulk_pending(40)
    ranks = {a.id: (3 if i % 5 == 0 else -2 if i % 7 == 0 else 0) for i, a in enumerate(items)}
    for approval_id, rank in ranks.items():
        Approval.objects.filter(id=approval_id).update(priority=rank)
    stored = {a.id: a for a in Approval.objects.filter(id__in=ranks)}
    expected = [
        a.id
        for a in sorted(
            stored.values(), key=lambda a: (a.priority, a.created_at, a.id), reverse=True
        )
    ]
    assert [ranks[i] for i in expected][:8] == [3] * 8 and ranks[expected[-1]] == -2

    login(client, lead)
    seen, url, pages = [], INBOX, []
    while url:
        html = client.get(url).content.decode()
        pages.append(html)
        seen += shown(html)
        older = re.search(r'href="\?(older=[^"]+)" rel="next"', html)
        url = INBOX + "?" + older.group(1).replace("&amp;", "&") if older else None
    assert seen == expected and len(pages) == 2
    # and back: "newer" from the second page is the first page again
    newer = re.search(r'href="\?(newer=[^"]+)"', pages[1]).group(1).replace("&amp;", "&")
    assert shown(client.get(INBOX + "?" + newer).content.decode()) == expected[:25]
    # the poll of the second page keeps showing that page
    poll = re.search(r'hx-get="/approvals/\?([^"]*fragment=items[^"]*)"', pages[1]).group(1)
    again = client.get(INBOX + "?" + poll.replace("&amp;", "&"), HTTP_HX_REQUEST="true")
    assert shown(again.content.decode()) == expected[25:]
    assert 'class="chip priority"' in pages[0]

    listed = ApiClient(lead).get("/api/approvals?status=pending&limit=500").json()["approvals"]
    assert [a["id"] for a in listed] == expected
    assert [a["priority"] for a in listed] == [ranks[i] for i in expected]


def test_a_garbled_cursor_is_the_first_page(client, lead):
    bulk_pending(3)
    login(client, lead)
    first = shown(client.get(INBOX).content.decode())
    for cursor in ("x~1-2", "1~abc-2", "99999999~1-2", "1-2", "~1-2"):
        assert shown(client.get(INBOX + "?older=" + cursor).content.decode()) in (first, [])
