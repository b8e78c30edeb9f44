"""The support desk's pages (issue 34, item 1), in-process on PostgreSQL: the ticket queue (open
tickets newest first, search by order, customer and words, keyset pages), a ticket with its order,
refunds and runs, and the "run the agent" button (the same start service and permission as
every door, CSRF-protected, one run per form however often it is sent)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client
from django.utils import timezone

from agentruns.models import Run
from agentruns.services import start_run
from support.models import GatewayRefund, Order, OutboxMessage, Ticket, TicketNote
from tests.helpers import make_user

pytestmark = pytest.mark.django_db

QUEUE = "/tickets/"


@pytest.fixture
def people(seeded, django_user_model) -> dict:
    return {u.username: u for u in django_user_model.objects.all()}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def ticket_ids(html: str) -> list[str]:
    return re.findall(r'<tr data-ticket="([^"]+)"', html)


def test_the_queue_lists_open_tickets_newest_first_in_keyset_pages(people):
    now = timezone.now()
    # seed_demo made T-1001..T-1050 at once: spread them, T-1050 newest
    for n in range(1001, 1051):
        Ticket.objects.filter(ticket_id=f"T-{n}").update(
            created_at=now - timedelta(minutes=2000 - n)
        )
    Ticket.objects.filter(ticket_id="T-1049").update(status="closed")
    client = signed_in(people["viewer"])
    first = client.get(QUEUE).content.decode()
    shown = ticket_ids(first)
    assert shown[:3] == ["T-1050", "T-1048", "T-1047"]  # newest first, the closed one left out
    assert len(shown) == 25 and "T-1049" not in shown
    older = re.search(r'rel="next" href="\?older=([^"]+)"', first).group(1)
    second = ticket_ids(client.get(QUEUE, {"older": older}).content.decode())
    assert second[0] == "T-1024" and len(second) == 24  # 49 open: 25 + 24, none twice
    assert not set(shown) & set(second)
    every = ticket_ids(client.get(QUEUE, {"status": "any"}).content.decode())
    assert every[:2] == ["T-1050", "T-1049"]
    # an htmx search swaps the rows alone
    rows = client.get(QUEUE, {"q": "ORD-1007"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<table" in rows and "<header" not in rows


def test_the_queue_searches_by_order_customer_and_words(people):
    client = signed_in(people["approver"])

    def found(q: str) -> list[str]:
        return ticket_ids(client.get(QUEUE, {"q": q}).content.decode())

    assert found("ORD-1007") == ["T-1007"]
    assert found("t-1007") == ["T-1007"]  # any case
    customer = Order.objects.get(order_id="ORD-1012").customer_name  # "Chloe Haddad"
    by_name = found(customer.split()[1].lower())
    assert "T-1012" in by_name
    assert all(
        Order.objects.get(tickets__ticket_id=t).customer_name.endswith(customer.split()[1])
        for t in by_name
    )
    ticket = Ticket.objects.get(ticket_id="T-1033")
    ticket.body = "The zebra-striped umbrella leaks."
    ticket.save()
    assert found("zebra-striped") == ["T-1033"]
    # a customer renamed: their tickets are found by the new name
    order = ticket.order
    order.customer_name = "Zoltan Quixote"
    order.save()
    assert found("quixote") == ["T-1033"]
    assert found("no such words anywhere") == []
    page = client.get(QUEUE, {"q": "<script>x</script>"}).content.decode()
    assert "<script>x</script>" not in page  # the search is shown escaped


def test_a_ticket_shows_the_customer_the_order_its_refunds_and_its_runs(people):
    ticket = Ticket.objects.select_related("order").get(ticket_id="T-1005")
    order = ticket.order
    TicketNote.objects.create(ticket=ticket, body="Called the customer.", idempotency_key="n-1")
    OutboxMessage.objects.create(order=order, to=order.customer_email, body="We refunded 10.00.")
    GatewayRefund.objects.create(order_id=order.order_id, amount_cents=1000, idempotency_key="k1")
    GatewayRefund.objects.create(order_id=order.order_id, amount_cents=550, idempotency_key="k2")
    GatewayRefund.objects.create(order_id="ORD-1006", amount_cents=999, idempotency_key="k3")
    mine = start_run("refund", {"order_id": order.order_id, "ticket_id": "T-1005"}).run
    by_api = start_run("refund", {"order_id": order.order_id, "message": "hi"}).run
    # a longer order id that starts with this one is another order: not listed
    Order.objects.create(
        order_id="ORD-10050", customer_name="X Y", customer_email="x@y.z", amount_cents=100
    )
    other = start_run("refund", {"order_id": "ORD-10050"}).run

    page = signed_in(people["viewer"]).get(f"/tickets/{ticket.ticket_id}/").content.decode()
    assert order.customer_name in page and ticket.body in page
    assert order.item in page and order.amount in page and order.status in page
    assert "Called the customer." in page and "We refunded 10.00." in page
    assert page.count('class="refund-row"') == 2
    assert "15.50 USD" in page  # the refunds so far, in the currency
    left = order.amount_cents - 1550
    assert f"{left // 100:,}.{left % 100:02d} USD left" in page
    assert str(mine.id) in page and str(by_api.id) in page and str(other.id) not in page
    assert page.count('class="chip s-queued"') == 2
    # a viewer may look, not run the agent: told who can, no form
    assert 'id="start-on-ticket"' not in page and "Only people who may start runs" in page
    # a missing ticket is a 404 page in the layout
    missing = signed_in(people["viewer"]).get("/tickets/T-0/")
    assert missing.status_code == 404 and 'id="error-page"' in missing.content.decode()


def form_token(client: Client, ticket_id: str) -> str:
    page = client.get(f"/tickets/{ticket_id}/").content.decode()
    return re.search(r'name="form_token" value="([^"]+)"', page).group(1)


def test_the_button_runs_the_agent_on_the_ticket_once_per_form(people):
    client = signed_in(people["approver"])
    token = form_token(client, "T-1003")
    response = client.post("/tickets/T-1003/run/", {"form_token": token})
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.id}/"
    ticket = Ticket.objects.select_related("order").get(ticket_id="T-1003")
    assert run.agent == "refund" and run.created_by == people["approver"]
    assert run.input == {"order_id": "ORD-1003", "ticket_id": "T-1003", "message": ticket.body}
    # the runs list finds it by its customer (support/agents.py `desk_search_keys`)
    listed = client.get("/runs/", {"q": ticket.order.customer_name}).content.decode()
    assert str(run.id) in listed
    # a double click (the same form again): the same run, nothing new
    again = client.post("/tickets/T-1003/run/", {"form_token": token})
    assert again["Location"] == f"/runs/{run.id}/" and Run.objects.count() == 1
    # a new page is a new form: a second run
    client.post("/tickets/T-1003/run/", {"form_token": form_token(client, "T-1003")})
    assert Run.objects.count() == 2
    # a token that is not one of ours starts nothing
    forged = client.post("/tickets/T-1003/run/", {"form_token": "x"}, follow=True)
    assert "form has expired" in forged.content.decode() and Run.objects.count() == 2


def test_running_the_agent_needs_the_start_permission_and_csrf(people, django_user_model):
    viewer = signed_in(people["viewer"])
    token = form_token(signed_in(people["approver"]), "T-1004")  # (the viewer's page has none)
    refused = viewer.post("/tickets/T-1004/run/", {"form_token": token})
    assert refused.status_code == 403 and "start_run" in refused.content.decode()
    # a trainee may start (their run may not refund: its snapshot says so)
    trainee = signed_in(people["trainee"])
    assert trainee.post("/tickets/T-1004/run/", {"form_token": token}).status_code == 302
    run = Run.objects.get()
    assert run.permissions["tools"]["issue_refund"]["allowed"] is False
    # without the CSRF token the POST is refused before any view runs
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(people["approver"])
    assert strict.post("/tickets/T-1004/run/", {"form_token": token}).status_code == 403
    assert Run.objects.count() == 1
    # someone who may start runs but not see tickets sees neither the ticket nor its button
    bot = make_user(django_user_model, "bot", ["agentruns.start_run", "agentruns.view_run"])
    assert signed_in(bot).get("/tickets/T-1004/").status_code == 403
    assert signed_in(bot).post("/tickets/T-1004/run/", {"form_token": token}).status_code == 403


def test_the_navigation_links_the_desk_for_who_may_see_it(people, django_user_model):
    page = signed_in(people["viewer"]).get("/runs/").content.decode()
    assert '<a href="/tickets/" class="">Tickets</a>' in page
    outsider = make_user(django_user_model, "outsider", ["agentruns.view_run"])
    assert ">Tickets</a>" not in signed_in(outsider).get("/runs/").content.decode()
    queue = signed_in(people["viewer"]).get(QUEUE).content.decode()
    assert '<a href="/tickets/" class="active" aria-current="page">Tickets</a>' in queue
    # a group given the permission in the admin sees the link (seed_demo's groups have it)
    group = Group.objects.create(name="desk")
    group.permissions.add(Permission.objects.get(codename="view_ticket"))
    outsider.groups.add(group)
    outsider = type(outsider).objects.get(pk=outsider.pk)
    assert ">Tickets</a>" in signed_in(outsider).get("/runs/").content.decode()


def test_the_migration_writes_the_search_words_that_save_writes(people):
    """Tickets from before the search (migration 0004 fills theirs in SQL): the same words."""
    from importlib import import_module

    from django.db import connection

    fill = import_module("support.migrations.0003_desk_search")._fill_search_text
    saved = dict(Ticket.objects.values_list("ticket_id", "search_text"))
    assert saved["T-1001"].startswith("T-1001 ORD-1001 ")
    Ticket.objects.update(search_text="")
    with connection.schema_editor() as editor:
        fill(None, editor)
    assert dict(Ticket.objects.values_list("ticket_id", "search_text")) == saved


def test_support_staff_land_on_the_queue(people, django_user_model):
    """Whoever may see the desk (approvers, trainees, viewers, leads) lands on the ticket queue
    when they sign in (issue 44): an approver no longer meets an empty runs page. Others land
    where they may look: an engineer's account on the runs, an inbox-only account on the inbox."""
    approver = people["approver"]
    approver.set_password("pw-approver-44")
    approver.save()
    signed = Client().post(
        "/accounts/login/", {"username": "approver", "password": "pw-approver-44"}, follow=True
    )
    assert signed.redirect_chain[-1][0] == QUEUE and 'data-ticket="T-1050"' in str(signed.content)
    for name in ("lead", "approver2", "viewer", "trainee"):
        assert signed_in(people[name]).get("/")["Location"] == QUEUE, name
    engineer = make_user(django_user_model, "engineer", ["agentruns.view_run"])
    assert signed_in(engineer).get("/")["Location"] == "/runs/"
    inbox_only = make_user(
        django_user_model, "inbox-only", ["approvals.view_approval", "approvals.decide_approval"]
    )
    assert signed_in(inbox_only).get("/")["Location"] == "/approvals/"
    assert Client().get("/")["Location"].startswith("/accounts/login/")
