"""Every page renders for a signed-in user without template syntax leaking into the HTML."""

from __future__ import annotations

import pytest

from agentruns.services import start_run
from tests.helpers import advance

pytestmark = pytest.mark.django_db

LEAKS = ("{#", "#}", "{%", "%}", "{{")


def test_pages_render_without_template_leaks(client, lead, seeded, settings):
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0
    run = start_run("refund", {"order_id": "ORD-1001", "message": "broken <b>please</b>"}).run
    advance(run)  # parks at issue_refund: the inbox has an item
    client.force_login(lead)
    for path in (
        "/runs/",
        "/approvals/",
        f"/runs/{run.id}/",
        "/runs/new/",
        "/runs/?status=waiting",
        "/tickets/",
        "/tickets/?q=ORD-1001",
        "/tickets/T-1001/",
        "/approvals/decided/",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
        html = response.content.decode()
        for leak in LEAKS:
            assert leak not in html, f"{leak!r} leaks into {path}"
        assert "<b>please</b>" not in html  # customer text is escaped


def test_login_page_renders(client):
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert "{#" not in response.content.decode()


def test_pages_need_login(client):
    for path in ("/runs/", "/approvals/", "/runs/new/"):
        response = client.get(path)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]
