"""Every support page in plain words (issue 44, item 3): the queue, the tickets, the inbox (its
cards, item pages and decided view), hand-overs, the run pages and the chat example, rendered for
a realistic demo state (a refund waiting for an approver, one decided, a request sent twice whose
second approval paid nothing ("approved, not paid"), a hand-over taken on its ticket and one
finished there (a refund by hand, a reply, the close), a run stopped while it waited, a ticket
with the agent's notes, a rejection) and read as a person reads them:
the text outside the engineering detail (a closed `<details>` is one click away) holds no ISO
timestamps, minor units, JSON, step numbers, operation or concurrency keys, tool or field names;
durations are right (an item that waited 40 s says so, however long ago it was decided); no
"Stopped: stopped"; notes end in one full stop.

The real engine in-process, the refund tool calling the real gateway (one daphne for the module).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from agentruns.models import Run, RunStatus
from agentruns.registry.run_input import concurrency
from agentruns.runtime.values.timestamps import ago_text, duration_text, moment_text
from agentruns.services import start_run
from agentruns.services.actions import stop_run
from approvals import services as decisions
from approvals.models import Approval
from support.models import TicketNote
from tests.helpers import advance
from tests.procs import gateway_refunds, module_web

pytestmark = pytest.mark.django_db(transaction=True)

# what a support person should never have to read (outside the engineering detail)
ENGINEERING = {
    "an ISO timestamp": re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}"),
    "minor units": re.compile(r"_cents\b|\b\d{4,} ?cents\b"),
    "JSON": re.compile(r"\{\s*\""),
    "a step number": re.compile(r"\bstep #\d", re.IGNORECASE),
    "an operation key": re.compile(r"\brefund:ORD-"),
    "a concurrency key": re.compile(r"concurrency key", re.IGNORECASE),
    "a tool or field name": re.compile(
        r"\b(?:issue_refund|hand_over|lookup_order|add_ticket_note|send_customer_reply"
        r"|order_id|ticket_id|amount_cents|customer_name)\b"
    ),
    "a stop reason twice": re.compile(r"Stopped: stopped", re.IGNORECASE),
    "a label that says nothing": re.compile(r"\bAnswer it\b"),
    "a sentence ending twice": re.compile(r"[^.]\.\.(?:\s|$)"),
}


class PlainText(HTMLParser):
    """The text a person reads on the page as it loads: text and `title`s, without scripts,
    styles, hidden elements and the content of a closed `<details>` (its summary is read)."""

    VOID = {"br", "img", "input", "meta", "link", "hr", "wbr", "source", "col", "area"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.stack: list[tuple[str, bool]] = []  # (tag, hides its content)

    def _hidden(self) -> bool:
        return any(hides for _, hides in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        hides = (
            tag in ("script", "style", "template")
            or "hidden" in names
            or (tag == "details" and "open" not in names)
        )
        if tag == "summary" and self.stack and self.stack[-1][0] == "details":
            # the summary of a closed details is read: lift the details' hiding for it
            details, _ = self.stack.pop()
            self.stack.append((details, False))
            self.stack.append(("summary", False))
            return
        if not self._hidden() and names.get("title"):
            self.parts.append(f" [{names['title']}] ")
        if tag not in self.VOID:
            self.stack.append((tag, hides))
        self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "summary" and self.stack and self.stack[-1][0] == "summary":
            self.stack.pop()
            if self.stack and self.stack[-1][0] == "details":
                self.stack[-1] = ("details", True)  # the rest of a closed details is hidden
            return
        while self.stack:
            top, _ = self.stack.pop()
            if top == tag:
                break
        self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._hidden():
            self.parts.append(data)

    @classmethod
    def of(cls, html: str) -> str:
        parser = cls()
        parser.feed(html)
        return re.sub(r"\s+", " ", "".join(parser.parts))


def engineering_words(text: str) -> list[str]:
    found = []
    for what, pattern in ENGINEERING.items():
        for match in pattern.finditer(text):
            start = max(0, match.start() - 60)
            found.append(f"{what}: …{text[start : match.end() + 40]}…")
    return found


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    with module_web(tmp_path_factory, django_db_blocker) as url:
        yield url


def _decided_by(run: Run, user, **decision) -> Run:
    item = Approval.objects.get(run=run, status="pending")
    decisions.decide(item.id, user=user, version=item.version, **decision)
    return advance(run)


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _token(page: str, name: str) -> str:
    return re.search(rf'name="{name}" value="([^"]+)"', page).group(1)


@pytest.fixture
def desk(seeded, gateway, settings, monkeypatch) -> dict:
    """The demo as a support team leaves it after a morning's work."""
    settings.REFUND_GATEWAY_URL = gateway + "/gateway"
    settings.REFUND_APPROVAL_THRESHOLD_CENTS = 0  # every refund waits for an approver
    users = {u.username: u for u in get_user_model().objects.all()}
    approver, approver2 = users["approver"], users["approver2"]

    def run_on(number: int, message: str, user) -> Run:
        run_input = {"order_id": f"ORD-{number}", "ticket_id": f"T-{number}", "message": message}
        return advance(start_run("refund", run_input, user=user).run)

    waiting = run_on(1050, "The yoga mat arrived torn, please refund.", approver)
    assert waiting.status == RunStatus.WAITING, waiting.error

    # decided seven minutes ago, after waiting 40 seconds
    decided = run_on(1001, "The blender arrived broken, refund $40", approver)
    decided = _decided_by(decided, approver2, decision="approve")
    assert decided.status == RunStatus.SUCCEEDED, decided.error
    item = Approval.objects.get(run=decided)
    asked = timezone.now() - timedelta(minutes=7)
    Approval.objects.filter(id=item.id).update(
        created_at=asked, decided_at=asked + timedelta(seconds=40)
    )
    # the same request again: not refunded twice, and the agent's note says when it was
    again = run_on(1001, "Still waiting for my refund of $40", approver)
    if again.status == RunStatus.WAITING:
        again = _decided_by(again, approver2, decision="approve")
    assert again.status == RunStatus.SUCCEEDED, again.error

    rejected = run_on(1012, "Please refund the lamp", approver)
    rejected = _decided_by(
        rejected, approver2, decision="reject", reason="It is outside the return window."
    )
    # a hand-over taken on its ticket by a colleague (still open)
    handover = run_on(1008, "The kettle is broken", users["trainee"])
    assert Approval.objects.filter(run=handover, kind="handover").exists()
    taken = _signed_in(approver2).post("/tickets/T-1008/handover/take/")
    assert taken.status_code == 302
    # and one finished on its ticket: taken, refunded by hand (approved in the inbox), a reply
    # in the person's words, closed with what they did
    finished = run_on(1015, "The rug came in the wrong colour, please refund it", users["trainee"])
    assert Approval.objects.filter(run=finished, kind="handover").exists()
    page = _signed_in(approver)
    page.post("/tickets/T-1015/handover/take/")
    html = page.get("/tickets/T-1015/").content.decode()
    refund = {"amount": "20.00", "reason": "for the wrong colour", "refund_token": ""}
    refund["refund_token"] = _token(html, "refund_token")
    assert page.post("/tickets/T-1015/handover/refund/", refund).status_code == 302
    by_hand = advance(Run.objects.get(input__ticket_id="T-1015", input__staff_refund__isnull=False))
    by_hand = _decided_by(by_hand, approver2, decision="approve")
    assert by_hand.status == RunStatus.SUCCEEDED, by_hand.error
    html = page.get("/tickets/T-1015/").content.decode()
    reply = {"text": "Hi, 20.00 is refunded; keep the rug.", "reply_token": ""}
    reply["reply_token"] = _token(html, "reply_token")
    assert page.post("/tickets/T-1015/handover/reply/", reply).status_code == 302
    closed = page.post("/tickets/T-1015/handover/close/", {"note": "refunded 20.00, replied"})
    assert closed.status_code == 302

    # the same request sent twice before anyone decided (the demo without the order's line,
    # REFUND_RUNS_PER_ORDER=0): both wait, both are approved, the second pays nothing
    monkeypatch.delitem(concurrency._declared, "refund")
    twice = [run_on(1030, "The lamp flickers, please refund it", approver) for _ in range(2)]
    assert [run.status for run in twice] == [RunStatus.WAITING] * 2, [r.error for r in twice]
    twice = [_decided_by(run, approver2, decision="approve") for run in twice]
    assert [run.status for run in twice] == [RunStatus.SUCCEEDED] * 2, [r.error for r in twice]
    assert len(gateway_refunds(gateway, "ORD-1030")) == 1
    not_paid = Approval.objects.get(run=twice[1], kind="approval")

    stopped = run_on(1020, "It never came", approver)
    stop_run(stopped.id, user=approver)
    return {
        "users": users,
        "runs": [waiting, decided, again, rejected, handover, finished, by_hand, *twice, stopped],
        "decided_item": item,
        "not_paid_item": not_paid,
        "tickets": ["T-1050", "T-1001", "T-1012", "T-1008", "T-1015", "T-1030", "T-1020"],
    }


def test_the_support_pages_speak_plain_words(desk):
    users = desk["users"]
    pages = ["/tickets/", "/approvals/", "/approvals/decided/", "/examples/chat/"]
    pages += [f"/tickets/{t}/" for t in desk["tickets"]]
    pages += [f"/approvals/{a.id}/" for a in Approval.objects.all()]
    pages += [f"/runs/{run.id}/" for run in desk["runs"]]
    seen = [(users["approver"], path) for path in pages]
    # the hand-over's ticket as the colleague who took it reads it (its refund and reply forms)
    seen.append((users["approver2"], "/tickets/T-1008/"))
    problems = {}
    for user, path in seen:
        response = _signed_in(user).get(path)
        assert response.status_code == 200, path
        found = engineering_words(PlainText.of(response.content.decode()))
        if found:
            problems[f"{path} ({user.username})"] = found
    assert not problems, "\n".join(
        f"{path}:\n  " + "\n  ".join(found) for path, found in problems.items()
    )


def test_an_approval_that_paid_nothing_says_so_in_words(desk):
    client = _signed_in(desk["users"]["approver"])
    item = desk["not_paid_item"]
    for path in (f"/approvals/{item.id}/", "/approvals/decided/"):
        text = PlainText.of(client.get(path, {"q": "ORD-1030"}).content.decode())
        assert re.search(
            r"[Aa]pproved, not paid: it was already done on [A-Z][a-z]{2} \d{1,2}, \d{2}:\d{2}",
            text,
        ), (path, text)


def test_a_handover_reads_on_its_ticket_in_words(desk):
    users = desk["users"]
    taken = PlainText.of(_signed_in(users["approver"]).get("/tickets/T-1008/").content.decode())
    # (a <time>'s title, the exact moment, is read before its text)
    assert re.search(r"approver2 took this hand-over (\[[^]]+\] )?(just now|\d+ min ago)", taken)
    closed = PlainText.of(_signed_in(users["viewer"]).get("/tickets/T-1015/").content.decode())
    when = r"(\[[^]]+\] )?(just now|\d+ min ago)"
    assert re.search(rf"Closed by approver {when} ?: refunded 20\.00, replied", closed), closed
    assert "20.00 USD" in closed  # the refund by hand, in the order's currency


def test_a_decided_item_says_how_long_it_waited(desk):
    client = Client()
    client.force_login(desk["users"]["approver"])
    item = desk["decided_item"]
    for path in (f"/approvals/{item.id}/", "/approvals/decided/"):
        text = PlainText.of(client.get(path, {"q": "ORD-1001"}).content.decode())
        assert "40 s" in text, path  # not "7 minutes": from its request to its decision
        assert "7 min" not in text.replace("7 min ago", ""), path


def test_the_agents_notes_say_when_in_words_and_end_once(desk):
    notes = list(TicketNote.objects.values_list("body", flat=True))
    assert notes and not any(re.search(r"\d{4}-\d{2}-\d{2}T", n) for n in notes), notes
    assert not [n for n in notes if n.endswith("..")], notes
    assert any("outside the return window." in n for n in notes), notes


def test_moments_and_durations_as_people_read_them():
    now = timezone.now()
    assert ago_text(now - timedelta(seconds=20), now) == "just now"
    assert ago_text(now - timedelta(minutes=2, seconds=5), now) == "2 min ago"
    assert ago_text(now - timedelta(hours=3), now) == "3 h ago"
    old = now - timedelta(days=3)
    assert ago_text(old, now) == moment_text(old, now)
    assert re.fullmatch(r"[A-Z][a-z]{2} \d{1,2}, \d{2}:\d{2}", moment_text(old, now))
    assert moment_text(old.isoformat(), now) == moment_text(old, now)  # as a result stores it
    assert moment_text("not a time") == "" and moment_text(None) == ""
    assert [duration_text(s) for s in (40, 420, 7500, 3 * 86400)] == [
        "40 s",
        "7 min",
        "2 h 5 min",
        "3 days",
    ]
