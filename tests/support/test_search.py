"""Search finds a request by the digits of its order number and by the customer's words (issue
44, item 6): the ticket queue, the inbox's decided view and the runs list (the API's `q`), on
PostgreSQL. The demo's search expansion (`support.agents.desk_search_keys`) says what such a
search stands for: the orders whose runs the runs' own search keys find."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from agentruns.services import start_run
from approvals import services as decisions
from approvals.models import Approval
from support.agents import desk_search_keys
from support.models import Order, Ticket
from tests.helpers import ApiClient, advance

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(seeded, settings, django_user_model) -> dict:
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    return {u.username: u for u in django_user_model.objects.all()}


def decided(order_id: str, user) -> Approval:
    run = advance(start_run("refund", {"order_id": order_id, "message": "broken"}).run)
    item = Approval.objects.get(run=run)
    decisions.decide(item.id, "reject", user, reason="send a photo", version=1)
    return item


def shown(client: Client, q: str) -> list[int]:
    html = client.get("/approvals/decided/", {"q": q}).content.decode()
    return [int(i) for i in re.findall(r'id="decided-(\d+)"', html)]


def test_the_decided_view_finds_an_order_by_its_digits_and_the_customers_words(people):
    approver = people["approver"]
    yoga = decided("ORD-1050", approver)  # the yoga mat
    other = decided("ORD-1001", approver)  # a blender
    ticket = Ticket.objects.get(ticket_id="T-1050")
    ticket.body = "Hi, my yoga mat smells of chemicals."
    ticket.save()
    client = Client()
    client.force_login(approver)
    assert shown(client, "ORD-1050") == [yoga.id]
    assert shown(client, "1050") == [yoga.id]  # the digits alone
    assert shown(client, "#1050") == [yoga.id]
    assert shown(client, "yoga") == [yoga.id]  # the customer's words
    assert shown(client, "chemicals") == [yoga.id]
    assert shown(client, "blender") == [other.id]
    assert shown(client, "10") == []  # digits of no order: nothing, not every order with a 10
    # the same words find the runs in the runs list and the API
    runs = ApiClient(approver).get("/api/runs?q=1050")
    assert [r["id"] for r in runs.json()["runs"]] == [str(yoga.run_id)]


def test_the_queue_finds_a_ticket_by_its_order_digits_and_words(people):
    order = Order.objects.get(order_id="ORD-1050")
    Ticket.objects.create(ticket_id="T-1050-2", order=order, subject="Strap", body="It tore")
    client = Client()
    client.force_login(people["viewer"])

    def found(q: str) -> list[str]:
        return re.findall(
            r'<tr data-ticket="([^"]+)"', client.get("/tickets/", {"q": q}).content.decode()
        )

    assert sorted(found("1050")) == ["T-1050", "T-1050-2"]
    assert "T-1050" in found("yoga")
    assert found("It tore") == ["T-1050-2"]


def test_what_a_search_stands_for(people):
    order = Order.objects.get(order_id="ORD-1050")
    assert desk_search_keys("1050") == ["ORD-1050"]
    assert desk_search_keys(" #1050 ") == ["ORD-1050"]
    assert desk_search_keys("99999") == []
    assert "ORD-1050" in desk_search_keys("yoga")
    assert desk_search_keys(order.customer_name.split()[0]) and desk_search_keys("a") == []
