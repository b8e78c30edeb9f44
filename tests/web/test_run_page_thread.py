"""The run page's thread (issue 33): who said what and when, escaped, and staff's message form
(HTMX, the API's service): a new run of the thread answers it."""

from __future__ import annotations

import pytest
from django.test import Client

from agentruns.models import Run, RunStatus, ThreadTurn
from agentruns.services.threads import post_message
from tests import thread_agents  # noqa: F401  (registers pa-talk)
from tests.helpers import advance, make_user

pytestmark = pytest.mark.django_db

AGENT_ASKING = "pa-ask-customer"  # asks "Which order do you mean?" (tests/thread_agents.py)
HOSTILE = '<script>alert("x")</script> my refund?'


@pytest.fixture
def thread_run(django_user_model) -> Run:
    customer = make_user(django_user_model, "customer", ["agentruns.start_run"])
    run = post_message("t-page", HOSTILE, user=customer, agent="pa-talk").run
    return advance(run)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_page_shows_the_thread_escaped_customer_first(thread_run, lead):
    page = logged_in(lead).get(f"/runs/{thread_run.id}/").content.decode()
    assert '<section class="run-thread"' in page
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; my refund?" in page
    thread = page[page.index('id="run-thread"') :]
    customer, agent = thread.index('data-author="customer"'), thread.index('data-author="agent"')
    assert customer < agent
    assert 'name="text"' in page  # the lead may start runs: the form is there


def test_staff_add_a_message_through_htmx(thread_run, lead):
    response = logged_in(lead).post(
        f"/runs/{thread_run.id}/thread/",
        {"text": "Staff here: approved by phone", "multitask": "enqueue"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    html = response.content.decode()
    turn = ThreadTurn.objects.get(thread_id="t-page", author="staff")
    assert turn.user == lead and turn.text == "Staff here: approved by phone"
    assert f"/runs/{turn.run_id}/" in html and 'data-author="staff"' in html
    assert advance(turn.run).output.endswith("| Staff here: approved by phone")


def test_staff_answer_the_question_a_run_asks_the_customer(lead, django_user_model):
    customer = make_user(django_user_model, "asking-customer", ["agentruns.start_run"])
    run = advance(post_message("t-page-ask", "ask me", user=customer, agent=AGENT_ASKING).run)
    assert run.status == RunStatus.WAITING
    page = logged_in(lead).get(f"/runs/{run.id}/").content.decode()
    thread = page[page.index('id="run-thread"') :]
    assert "Which order do you mean?" in thread and "waiting for the reply" in thread
    response = logged_in(lead).post(
        f"/runs/{run.id}/thread/",
        {"text": "ORD-5 <b>", "multitask": "enqueue"},
        HTTP_HX_REQUEST="true",
    )
    html = response.content.decode()
    assert response.status_code == 200 and "that asked for it goes on with it" in html
    assert "ORD-5 &lt;b&gt;" in html and 'data-author="staff"' in html
    assert not ThreadTurn.objects.filter(thread_id="t-page-ask", author="staff").exists()
    assert advance(run).output == "got: ORD-5 <b> from staff"


def test_who_may_post_and_bad_posts(thread_run, django_user_model, lead):
    viewer = logged_in(make_user(django_user_model, "viewer", ["agentruns.view_run"]))
    page = viewer.get(f"/runs/{thread_run.id}/").content.decode()
    assert 'id="run-thread"' in page and 'name="text"' not in page
    refused = viewer.post(f"/runs/{thread_run.id}/thread/", {"text": "hi"}, HTTP_HX_REQUEST="1")
    assert refused.status_code == 403
    empty = logged_in(lead).post(
        f"/runs/{thread_run.id}/thread/", {"text": "  "}, HTTP_HX_REQUEST="1"
    )
    assert empty.status_code == 400 and "needs text" in empty.content.decode()
    assert ThreadTurn.objects.filter(thread_id="t-page").count() == 1


def test_a_run_of_no_thread_has_no_thread_section(lead):
    from tests.helpers import script_run

    run = script_run([{"text": "hi"}])
    page = logged_in(lead).get(f"/runs/{run.id}/").content.decode()
    assert 'id="run-thread"' not in page
    assert logged_in(lead).post(f"/runs/{run.id}/thread/", {"text": "x"}).status_code == 404


def test_a_nul_byte_is_refused_not_a_500(thread_run, lead):
    response = logged_in(lead).post(
        f"/runs/{thread_run.id}/thread/", {"text": "a\x00b"}, HTTP_HX_REQUEST="1"
    )
    assert response.status_code == 400 and "NUL" in response.content.decode()
    assert ThreadTurn.objects.filter(thread_id="t-page").count() == 1


def test_the_form_is_offered_only_where_a_post_would_be_taken(django_user_model):
    """The audit: the run page offered the thread form to a user whose post was then refused
    (403 "another user's chat"). A chat's thread takes posts from its user or an operator: the
    form is theirs alone; a plain thread's is anyone's who may start runs."""
    looks = ["agentruns.view_run"]
    owner = make_user(django_user_model, "chat-owner", [*looks, "agentruns.start_run"])
    colleague = make_user(django_user_model, "colleague", [*looks, "agentruns.start_run"])
    operator = make_user(
        django_user_model, "chat-op", [*looks, "agentruns.start_run", "agentruns.operate_run"]
    )
    viewer = make_user(django_user_model, "only-looks", looks)
    chat_run = post_message("c-page", "hello", user=owner, agent="pa-talk", chat=True).run
    plain_run = post_message("t-plain", "hello", user=owner, agent="pa-talk").run

    def offered(user, run: Run) -> bool:
        page = logged_in(user).get(f"/runs/{run.id}/").content.decode()
        assert 'id="run-thread"' in page
        return 'class="thread-form"' in page

    assert [offered(u, chat_run) for u in (owner, colleague, operator, viewer)] == [
        True,
        False,
        True,
        False,
    ]
    assert [offered(u, plain_run) for u in (owner, colleague, operator, viewer)] == [
        True,
        True,
        True,
        False,
    ]
    # and what the form would have done: the colleague's post to the chat is refused
    refused = logged_in(colleague).post(f"/runs/{chat_run.id}/thread/", {"text": "mine now"})
    assert refused.status_code == 403
    assert ThreadTurn.objects.filter(thread_id="c-page").count() == 1
