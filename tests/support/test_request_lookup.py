"""The request a demo tool's call names (support/agents.py, `request_of`): the same ticket
`request_ticket` picks, found with its order in one query when the call names it or the order
has an open one (every lookup, note and reply asks it); a ticket of another order is none of
this order's requests."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from support.agents import request_of, request_ticket
from support.models import Order, Ticket, TicketStatus

pytestmark = pytest.mark.django_db


def test_the_request_and_its_order_in_one_query(seeded):
    ticket = Ticket.objects.filter(status=TicketStatus.OPEN).select_related("order").first()
    order = ticket.order
    for named in (ticket.ticket_id, None):
        expected = request_ticket(order, named)
        with CaptureQueriesContext(connection) as queries:
            found_order, found = request_of(order.order_id, named)
        assert (found_order, found) == (order, expected)
        assert len(queries) == 1, [q["sql"] for q in queries]


def test_another_orders_ticket_and_an_unknown_order_name_no_request(seeded):
    ticket = Ticket.objects.select_related("order").first()
    other = Order.objects.exclude(pk=ticket.order_id).first()
    assert request_of(other.order_id, ticket.ticket_id) == (other, None)
    assert request_of("ORD-0", None) == (None, None)


def test_an_order_without_an_open_ticket_gets_its_latest(seeded):
    ticket = Ticket.objects.select_related("order").first()
    Ticket.objects.filter(order=ticket.order).update(status=TicketStatus.RESOLVED)
    latest = Ticket.objects.filter(order=ticket.order).order_by("id").last()
    assert request_of(ticket.order.order_id, None) == (ticket.order, latest)
