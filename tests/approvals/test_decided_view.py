"""The inbox's decided view (issue 34, item 5): decided items, the newest decision first, searched
by order, customer, decider, date, kind and outcome, each with its history; and the runs list's
search by customer."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentruns.services import start_run
from approvals import services
from approvals.domain import history
from approvals.models import Approval, ApprovalStatus
from support.models import Order
from tests.helpers import advance

pytestmark = pytest.mark.django_db

DECIDED = "/approvals/decided/"


@pytest.fixture
def people(seeded, settings, django_user_model) -> dict:
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    return {u.username: u for u in django_user_model.objects.all()}


def parked(order_id: str) -> Approval:
    run = advance(start_run("refund", {"order_id": order_id, "message": "broken"}).run)
    return Approval.objects.get(run=run)


def shown(client: Client, **params) -> list[int]:
    html = client.get(DECIDED, params).content.decode()
    return [int(i) for i in re.findall(r'id="decided-(\d+)"', html)]


@pytest.fixture
def decided(people) -> dict[str, Approval]:
    """Four decided items and one still pending."""
    approver, approver2, lead = people["approver"], people["approver2"], people["lead"]
    items = {
        "approved": parked("ORD-1001"),
        "edited": parked("ORD-1002"),
        "rejected": parked("ORD-1003"),
        "old": parked("ORD-1004"),
    }
    services.decide(items["approved"].id, "approve", approver, version=1)
    lowered = {**items["edited"].requested_args, "amount_cents": 1000}
    services.decide(items["edited"].id, "approve", lead, edited_args=lowered, version=1)
    services.decide(items["rejected"].id, "reject", approver2, reason="not covered", version=1)
    services.decide(items["old"].id, "reject", approver, reason="too late", version=1)
    # decided three days ago (newest first is by the decision's time)
    Approval.objects.filter(id=items["old"].id).update(
        decided_at=timezone.now() - timedelta(days=3)
    )
    items["pending"] = parked("ORD-1005")
    return items


def test_decided_items_newest_decision_first_each_with_its_history(people, decided):
    client = Client()
    client.force_login(people["viewer"])  # looking needs view_approval only
    response = client.get(DECIDED)
    assert response.status_code == 200
    html = response.content.decode()
    order = [decided[k].id for k in ("rejected", "edited", "approved", "old")]
    assert shown(client) == order  # the pending item is not there
    assert 'aria-current="page">Decided</a>' in html  # the inbox's second tab
    card = html[html.index(f'id="decided-{decided["edited"].id}"') :]
    card = card[: card.index("</article>")]
    customer = Order.objects.get(order_id="ORD-1002").customer_name
    assert customer in card and "ORD-1002" in card and "10.00 USD" in card
    assert 'data-outcome="approved with edits"' in card
    # its history: the request, then the lead's approval with the edit it made
    history = re.findall(r"<li>(.*?)</li>", card[card.index('class="history"') :], re.S)
    assert "the agent</strong> asked to refund" in history[0]  # the tool's label, not its name
    assert "<strong>lead</strong> approved with edits" in history[1]
    # the edited amount in the order's currency, as on the card (issue 34, item 2)
    assert " · amount " in history[1] and "<strong>10.00 USD</strong>" in history[1]
    assert "amount_cents" not in history[1]
    rejected = html[html.index(f'id="decided-{decided["rejected"].id}"') :]
    assert "<strong>approver2</strong> rejected: “not covered”" in rejected


@pytest.mark.parametrize("ids_max", [500, 0], ids=["by-run-id", "down-the-decision-index"])
def test_search_by_order_customer_decider_date_kind_and_outcome(
    people, decided, ids_max, monkeypatch
):
    monkeypatch.setattr(history, "RUN_IDS_MAX", ids_max)  # (both ways answer the same)
    client = Client()
    client.force_login(people["approver"])
    ids = {k: a.id for k, a in decided.items()}
    assert shown(client, q="ORD-1003") == [ids["rejected"]]
    customer = Order.objects.get(order_id="ORD-1001").customer_name  # "Ada Lovelace"
    by_customer = shown(client, q=customer.split()[1])
    assert ids["approved"] in by_customer and ids["rejected"] not in by_customer
    assert shown(client, decider="APPROVER") == [ids["approved"], ids["old"]]  # any case
    assert shown(client, decider="approver2") == [ids["rejected"]]
    today = timezone.localdate()
    assert ids["old"] not in shown(client, since=today.isoformat())
    assert shown(client, until=(today - timedelta(days=2)).isoformat()) == [ids["old"]]
    assert shown(client, outcome="rejected") == [ids["rejected"], ids["old"]]
    assert shown(client, outcome="edited") == [ids["edited"]]
    assert shown(client, kind="reconciliation") == []
    assert len(shown(client, kind="approval")) == 4
    # nonsense filters are ignored, never a 500
    assert len(shown(client, since="yesterday", outcome="maybe", kind="x")) == 4
    assert client.get(DECIDED, {"older": "garbage"}).status_code == 200


def test_decided_pages_are_keyset_pages_of_constant_cost(people, decided):
    client = Client()
    client.force_login(people["approver"])
    newest = decided["rejected"]
    page = client.get(DECIDED).content.decode()
    assert "older →" not in page  # one page: 4 items
    # the cursor is (decided_at, id): the next page starts after the item it names
    from agentruns.selectors.pagination import encode_cursor

    cursor = encode_cursor(Approval.objects.get(id=newest.id), field="decided_at")
    assert shown(client, older=cursor)[0] == decided["edited"].id
    with CaptureQueriesContext(connection) as few:
        client.get(DECIDED)
    for order_id in ("ORD-1010", "ORD-1011", "ORD-1012"):
        services.decide(parked(order_id).id, "approve", people["lead"], version=1)
    with CaptureQueriesContext(connection) as more:
        client.get(DECIDED)
    assert len(more.captured_queries) == len(few.captured_queries)
    assert Approval.objects.filter(status=ApprovalStatus.PENDING).count() == 1


def test_the_runs_list_finds_runs_by_customer(people):
    lovelace = start_run("refund", {"order_id": "ORD-1001", "message": "broken"}).run
    other = start_run("refund", {"order_id": "ORD-1002", "message": "broken"}).run
    customer = Order.objects.get(order_id="ORD-1001").customer_name
    client = Client()
    client.force_login(people["viewer"])
    for q in (customer, customer.split()[1].lower(), "ORD-1001"):
        html = client.get("/runs/", {"q": q}).content.decode()
        assert str(lovelace.id) in html and str(other.id) not in html, q
    assert 'placeholder="order, ticket, customer or run id"' in html
    # asked when searching (support/agents.py `desk_search_keys`), so a renamed customer is
    # found by the new name at once
    order = Order.objects.get(order_id="ORD-1001")
    order.customer_name = "Grace Hopper"
    order.save()
    html = client.get("/runs/", {"q": "hopper"}).content.decode()
    assert str(lovelace.id) in html and str(other.id) not in html


def test_a_failing_search_expansion_costs_its_keys_never_the_page(people, monkeypatch):
    from agentruns.registry import search

    def broken(q: str) -> list[str]:
        raise RuntimeError("the domain's lookup failed")

    monkeypatch.setattr(search, "_expansions", [broken, *search._expansions])
    run = start_run("refund", {"order_id": "ORD-1001", "message": "broken"}).run
    client = Client()
    client.force_login(people["viewer"])
    for q in ("ORD-1001", Order.objects.get(order_id="ORD-1001").customer_name):
        response = client.get("/runs/", {"q": q})
        assert response.status_code == 200 and str(run.id) in response.content.decode()
