"""Every page and API route, for every role of the demo (DESIGN.md 6), answers as the role says.

The roles are the ones `seed_demo` creates (lead, approver, approver2, viewer, trainee), plus an
operator (may look and operate runs, may not start them), a signed-in user with no permission
at all, and nobody signed in. "Allowed" requests are chosen so they pass the permission gate and
then stop at a harmless refusal (a 400 for a bad body, a 409 for a finished run, a redirect with
a message), so the matrix never changes what it probes. A route added without a row here fails
`test_every_route_has_a_row`: say who may use it.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from agentruns.api.endpoint import ENDPOINTS
from agentruns.models import Run, RunStatus, Step
from agentruns.services import start_run
from approvals.models import Approval
from tests.conftest import ApiClient, make_user
from tests.helpers import advance

pytestmark = pytest.mark.django_db

ROLES = ["lead", "approver", "approver2", "viewer", "trainee", "operator", "nobody", "anonymous"]
LOOK = {"lead", "approver", "approver2", "viewer", "trainee", "operator"}
INBOX = LOOK - {"operator"}  # view_approval
START = {"lead", "approver", "approver2", "trainee"}
OPERATE = {"lead", "operator"}
DECIDE = {"lead", "approver", "approver2"}
TICKETS = LOOK - {"operator"}  # support.view_ticket (seed_demo gives it to everyone who looks)
ADD_TICKET = START  # support.add_ticket: seed_demo gives it to who may start runs
SIGNED_IN = set(ROLES) - {"anonymous"}


def by_role(allowed: set[str], yes: int, *, no: int = 403, anonymous: int | str = 401) -> dict:
    out: dict[str, int | str] = {role: yes if role in allowed else no for role in ROLES}
    out["anonymous"] = anonymous
    return out


# (method, path template, body, {role: expected status}); "login" = a redirect to the login page
API = [
    ("POST", "/api/runs", {"agent": "script", "input": []}, by_role(START, 400)),
    ("GET", "/api/runs", None, by_role(LOOK, 200)),
    ("GET", "/api/runs/{run}", None, by_role(LOOK, 200)),
    ("GET", "/api/runs/{run}/events", None, by_role(LOOK, 200)),
    ("POST", "/api/runs/{run}/cancel", {}, by_role(OPERATE, 409)),
    # stop: its starter (nobody here started the run) or an operator; it ended already: 409
    ("POST", "/api/runs/{run}/stop", {}, by_role(OPERATE, 409)),
    ("POST", "/api/runs/{run}/retry", {}, by_role(OPERATE, 409)),
    # fork needs operate_run (the endpoint) and start_run (the service): the operator has one
    ("POST", "/api/runs/{run}/fork", {"from_step": 1}, by_role(OPERATE - {"operator"}, 409)),
    # the fork's confirmation, as on the run page: operators (without from_step: 400)
    ("GET", "/api/runs/{run}/fork", None, by_role(OPERATE, 400)),
    ("POST", "/api/runs/{run}/steps/0/resolve", {"result": {}}, by_role(OPERATE, 409)),
    ("GET", "/api/approvals", None, by_role(INBOX, 200)),
    ("POST", "/api/approvals/{approval}", {"decision": "maybe"}, by_role(DECIDE, 400)),
    # claims: probed on an id that names nothing, so the matrix takes no claim
    ("POST", "/api/approvals/{missing}/claim", {}, by_role(DECIDE, 404)),
    ("POST", "/api/approvals/{missing}/release", {}, by_role(DECIDE, 404)),
    ("POST", "/api/approvals/bulk", {"ids": [], "decision": "maybe"}, by_role(DECIDE, 400)),
    # an operation key: looking needs view_run; one more execution operate_run (a key never
    # executed has nothing to allow: 409)
    ("GET", "/api/operation-keys/refund:ORD-0", None, by_role(LOOK, 200)),
    ("POST", "/api/operation-keys/refund:ORD-0/allow", {}, by_role(OPERATE, 409)),
    # the AI SDK chat: watching needs view_run, starting start_run too (an empty message: 400)
    (
        "POST",
        "/api/chat/script",
        {"id": "matrix-chat", "messages": [{"id": "m1", "role": "user", "parts": []}]},
        by_role(START, 400),
    ),
    ("GET", "/api/chat/script/no-such-chat/stream", None, by_role(LOOK, 204)),
    # the chat's stop button: the caller's own chat (this one has no run: 404)
    ("POST", "/api/chat/script/no-such-chat/stop", {}, by_role(LOOK, 404)),
    # threads: reading needs view_run (no such thread: 404), posting start_run (no text: 400)
    ("GET", "/api/threads/no-such-thread", None, by_role(LOOK, 404)),
    ("POST", "/api/threads/matrix-thread/messages", {"text": ""}, by_role(START, 400)),
    # hooks: agentruns.resolve_hook, which of the demo roles only the lead (every permission)
    # has; machines sign instead
    ("POST", "/api/hooks/no-such-token", {}, by_role({"lead"}, 404)),
    # a customer's request from an outside channel: support.add_ticket (no such order: 404)
    (
        "POST",
        "/api/tickets",
        {"order_id": "ORD-0", "subject": "s", "body": "b"},
        by_role(ADD_TICKET, 404),
    ),
]
PAGES = [
    ("GET", "/runs/", None, by_role(LOOK, 200, anonymous="login")),
    ("GET", "/runs/{run}/", None, by_role(LOOK, 200, anonymous="login")),
    ("GET", "/runs/new/", None, by_role(START, 200, anonymous="login")),
    (
        "POST",
        "/runs/new/",
        {"agent": "script", "input": "[oops"},
        by_role(START, 400, anonymous="login"),
    ),
    ("POST", "/runs/{run}/retry/", {}, by_role(OPERATE, 302, anonymous="login")),
    ("POST", "/runs/{run}/cancel/", {}, by_role(OPERATE, 302, anonymous="login")),
    ("POST", "/runs/{run}/stop/", {}, by_role(OPERATE, 302, anonymous="login")),
    # a staff message to the run's thread: start_run (this run is in no thread: 404)
    ("POST", "/runs/{run}/thread/", {"text": ""}, by_role(START, 404, anonymous="login")),
    (
        "POST",
        "/runs/{run}/fork/",
        {"from_step": "1"},
        by_role(OPERATE - {"operator"}, 302, anonymous="login"),
    ),
    # the fork's confirmation (without from_step: back to the run page with the reason)
    ("GET", "/runs/{run}/fork/", None, by_role(OPERATE, 302, anonymous="login")),
    (
        "POST",
        "/runs/steps/{step}/resolve/",
        {"result": "{}"},
        by_role(OPERATE, 302, anonymous="login"),
    ),
    ("GET", "/approvals/", None, by_role(INBOX, 200, anonymous="login")),
    (
        "POST",
        "/approvals/{approval}/decide/",
        {"action": "no-such-action"},
        by_role(DECIDE, 302, anonymous="login"),
    ),
    ("GET", "/approvals/{approval}/", None, by_role(INBOX, 200, anonymous="login")),
    ("POST", "/approvals/{approval}/claim/", {}, by_role(DECIDE, 302, anonymous="login")),
    ("POST", "/approvals/{approval}/release/", {}, by_role(DECIDE, 302, anonymous="login")),
    ("POST", "/approvals/bulk/", {"action": "maybe"}, by_role(DECIDE, 302, anonymous="login")),
    ("GET", "/approvals/decided/", None, by_role(INBOX, 200, anonymous="login")),
    # one more execution of a card's operation key: the inbox's viewers with operate_run (this
    # card's call takes no key: back to the inbox with the reason)
    ("POST", "/approvals/{approval}/allow/", {}, by_role(INBOX & OPERATE, 302, anonymous="login")),
    # the navigation's counts: every signed-in page polls them (each count only for its viewers)
    ("GET", "/runs/nav/", None, by_role(SIGNED_IN, 200, anonymous="login")),
    # the support desk: looking needs support.view_ticket; running the agent start_run too (a
    # form token that is not one of ours: back to the ticket with a message, nothing started)
    ("GET", "/tickets/", None, by_role(TICKETS, 200, anonymous="login")),
    ("GET", "/tickets/{ticket}/", None, by_role(TICKETS, 200, anonymous="login")),
    (
        "POST",
        "/tickets/{ticket}/run/",
        {"form_token": "not-a-token"},
        by_role(TICKETS & START, 302, anonymous="login"),
    ),
    # finishing a hand-over on its ticket: whoever looks may post, the action itself needs the
    # hand-over taken (a decision's rights) and, to refund, a tool policy that allows it (this
    # ticket has no hand-over: back to it with the reason, nothing done)
    ("POST", "/tickets/{ticket}/handover/take/", {}, by_role(TICKETS, 302, anonymous="login")),
    (
        "POST",
        "/tickets/{ticket}/handover/refund/",
        {"amount": "1.00", "refund_token": "not-a-token"},
        by_role(TICKETS - {"viewer", "trainee"}, 302, anonymous="login"),
    ),
    (
        "POST",
        "/tickets/{ticket}/handover/reply/",
        {"text": ""},
        by_role(TICKETS, 302, anonymous="login"),
    ),
    (
        "POST",
        "/tickets/{ticket}/handover/close/",
        {"note": ""},
        by_role(TICKETS, 302, anonymous="login"),
    ),
]


@pytest.fixture
def world(seeded, django_user_model) -> dict:
    users = {u.username: u for u in django_user_model.objects.all()}
    users["operator"] = make_user(
        django_user_model, "operator", ["agentruns.view_run", "agentruns.operate_run"]
    )
    users["nobody"] = make_user(django_user_model, "nobody")
    done = advance(
        start_run(
            "script", {"script": [{"calls": [["t_echo", {"text": "a"}]]}, {"text": "ok"}]}
        ).run
    )
    assert done.status == RunStatus.SUCCEEDED
    parked = advance(start_run("script", {"script": [{"calls": [["t_pay", {"amount": 500}]]}]}).run)
    assert parked.status == RunStatus.WAITING
    return {
        "users": users,
        "ids": {
            "run": done.id,
            "step": Step.objects.get(run=done, index=0).id,
            "approval": Approval.objects.get(run=parked).id,
            "missing": 999_999_999,
            "ticket": "T-1001",
        },
    }


def _check(client_for, table: list, ids: dict, role: str) -> list[str]:
    wrong = []
    for method, template, body, expected in table:
        path = template.format(**ids)
        client = client_for()
        response = client.post(path, body) if method == "POST" else client.get(path)
        want = expected[role]
        if want == "login":
            ok = response.status_code == 302 and "/accounts/login/" in response["Location"]
        else:
            ok = response.status_code == want
            if want == 302:  # allowed: back to the page, never to the login
                ok = ok and "/accounts/login/" not in response["Location"]
        if not ok:
            wrong.append(f"{method} {path}: {response.status_code}, expected {want}")
    return wrong


@pytest.mark.parametrize("role", ROLES)
def test_api_answers_as_the_role_says(world, role):
    user = world["users"].get(role)
    if user is None:
        anonymous = Client()

        def client_for():
            return _JsonClient(anonymous)
    else:
        api = ApiClient(user)

        def client_for():
            return api

    wrong = _check(client_for, API, world["ids"], role)
    assert not wrong, f"{role}: " + "; ".join(wrong)
    # nothing the matrix sent changed a run or decided anything
    assert Run.objects.filter(status=RunStatus.SUCCEEDED).count() == 1
    assert Run.objects.count() == 2 and Approval.objects.get().status == "pending"


@pytest.mark.parametrize("role", ROLES)
def test_pages_answer_as_the_role_says(world, role):
    client = Client()
    if role != "anonymous":
        client.force_login(world["users"][role])
    wrong = _check(lambda: client, PAGES, world["ids"], role)
    assert not wrong, f"{role}: " + "; ".join(wrong)
    assert Run.objects.count() == 2 and Approval.objects.get().status == "pending"


def test_navigation_offers_what_the_role_may_use(world):
    client = Client()
    client.force_login(world["users"]["viewer"])
    page = client.get("/runs/").content.decode()
    assert "Start a run" not in page and "Inbox" in page
    client.force_login(world["users"]["trainee"])
    assert "Start a run" in client.get("/runs/").content.decode()


class _JsonClient:
    """The anonymous caller of the API: JSON bodies, no credentials."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def get(self, path: str):
        return self.client.get(path)

    def post(self, path: str, data=None):
        return self.client.post(path, json.dumps(data or {}), content_type="application/json")


def _page_routes(resolver: URLResolver, prefix: str = "") -> set[str]:
    out = set()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            out |= _page_routes(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            out.add(prefix + str(entry.pattern))
    return out


def test_every_route_has_a_row():
    """A new endpoint or page must say here which roles may use it."""
    assert get_resolver().url_patterns  # every endpoint module is imported with the URLconf
    declared = {(e.method, e.path) for e in ENDPOINTS}
    covered = {
        (
            method,
            path.removeprefix("/api")
            .replace("{run}", "{run_id}")
            .replace("{approval}", "{approval_id}")
            .replace("{missing}", "{approval_id}")
            .replace("/steps/0/", "/steps/{index}/")
            .replace("/chat/script/no-such-chat/", "/chat/{agent}/{chat_id}/")
            .replace("/chat/script", "/chat/{agent}")
            .replace("/refund:ORD-0", "/{key}")
            .replace("/threads/no-such-thread", "/threads/{thread_id}")
            .replace("/threads/matrix-thread/", "/threads/{thread_id}/")
            .replace("/hooks/no-such-token", "/hooks/{token}"),
        )
        for method, path, _, _ in API
    }
    assert declared <= covered, f"API routes without a role row: {sorted(declared - covered)}"
    pages = {
        p for p in _page_routes(get_resolver()) if p.startswith(("runs/", "approvals/", "tickets/"))
    }
    page_rows = {
        path.lstrip("/")
        .replace("{run}", "<uuid:run_id>")
        .replace("{step}", "<uuid:step_id>")
        .replace("{approval}", "<int:approval_id>")
        .replace("{ticket}", "<str:ticket_id>")
        for _, path, _, _ in PAGES
    }
    assert pages <= page_rows, f"pages without a role row: {sorted(pages - page_rows)}"


def test_a_service_refuses_a_start_without_the_permission(world):
    """The check lives in the service: a caller that forgot the view's check is still refused."""
    from django.core.exceptions import PermissionDenied

    from agentruns.services import fork_run

    for role in ("viewer", "nobody", "operator"):
        with pytest.raises(PermissionDenied, match="start_run"):
            start_run("script", {"script": []}, user=world["users"][role])
    with pytest.raises(PermissionDenied, match="start_run"):
        fork_run(world["ids"]["run"], 2, user=world["users"]["operator"])
    assert Run.objects.count() == 2
    assert Permission.objects.filter(codename="start_run").exists()


def test_a_repeated_idempotency_key_names_only_its_starters_run(world):
    """A key is its starter's (issue 46): another user's same key, whether or not they may view
    runs, starts their own run and never hands over (or names) the first one."""
    users = world["users"]
    bot = make_user(type(users["lead"]), "bot", ["agentruns.start_run"])  # may start, not look
    body = {"agent": "script", "input": {"script": []}}
    key = {"HTTP_IDEMPOTENCY_KEY": "ticket-T-1001"}
    mine = ApiClient(users["trainee"]).post("/api/runs", body, **key)
    assert mine.status_code == 201
    again = ApiClient(users["trainee"]).post("/api/runs", body, **key)
    assert again.status_code == 200 and again.json()["id"] == mine.json()["id"]
    for who in (bot, users["approver"]):  # may not view runs; may view them
        own = ApiClient(who).post("/api/runs", body, **key)
        assert own.status_code == 201, own.content
        assert mine.json()["id"] not in own.content.decode()  # not even its id
        repeat = ApiClient(who).post("/api/runs", body, **key)
        assert repeat.status_code == 200 and repeat.json()["id"] == own.json()["id"]
    assert Run.objects.filter(dedupe_key="ticket-T-1001").count() == 3
