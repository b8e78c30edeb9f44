"""The JSON API of conversations (issue 33): a thread of runs, one run per message.

    POST /api/threads/<id>/messages   {"text", "multitask", "agent"?, "from"?, "input"?, "id"?}
    GET  /api/threads/<id>            its messages (customer, staff, agent) and its runs

A thread is created by its first message (naming its `agent`) or by `POST /api/runs` with
`"thread": "<id>"` (or `true`: an id of ours). Posting needs `agentruns.start_run`, reading
`agentruns.view_run`, as for runs (`services/threads.py` says what `multitask` does).
"""

from __future__ import annotations

from django.http import HttpRequest

from agentruns.api.endpoint import endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.schemas import PRIORITY, RUN, RUN_SUMMARY, TEXT_OR_NULL, TIME, TRACEPARENT, obj
from agentruns.api.serializers import run_payload, run_summary_payload
from agentruns.models import Thread
from agentruns.registry import UnknownAgent
from agentruns.runtime.values.timestamps import iso
from agentruns.selectors.threads import (
    ThreadMessageView,
    get_thread,
    thread_messages,
    thread_runs,
)
from agentruns.services.threads import (
    MAX_TEXT_CHARS,
    MULTITASK,
    Posted,
    ThreadRefused,
    post_message,
)

VIEW = "agentruns.view_run"
START = "agentruns.start_run"
# the AI SDK's chat ids, UUIDs and the like; "." and ".." can never be path segments
THREAD_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}$"}
THREAD_PATH = {"thread_id": THREAD_ID}
AGENT = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,100}$"}

MESSAGE = obj(
    {
        "id": {"type": "string"},
        "author": {"type": "string", "enum": ["customer", "staff", "agent"]},
        "sender": TEXT_OR_NULL,
        "text": {"type": "string"},
        "run_id": TEXT_OR_NULL,
        "created_at": TIME,
        "entered": {"type": "boolean"},
    }
)
THREAD = obj(
    {
        "id": {"type": "string"},
        "agent": {"type": "string"},
        "created_by": TEXT_OR_NULL,
        "created_at": TIME,
        "messages": {"type": "array", "items": MESSAGE},
        "runs": {"type": "array", "items": RUN_SUMMARY},
    }
)
POSTED = obj(
    {
        # null for a caller without `view_run` (another's run, the thread's other messages)
        "run": {"anyOf": [RUN, {"type": "null"}]},
        "message": {"anyOf": [MESSAGE, {"type": "null"}]},
        "thread": {"anyOf": [THREAD, {"type": "null"}]},
        "run_id": {"type": "string", "format": "uuid"},
    }
)


def message_payload(m: ThreadMessageView) -> dict:
    return {
        "id": m.id,
        "author": m.author,
        "sender": m.sender,
        "text": m.text,
        "run_id": m.run_id,
        "created_at": iso(m.created_at),
        "entered": m.entered,
    }


def thread_payload(thread: Thread) -> dict:
    return {
        "id": thread.id,
        "agent": thread.agent,
        "created_by": thread.created_by.get_username() if thread.created_by_id else None,
        "created_at": iso(thread.created_at),
        "messages": [message_payload(m) for m in thread_messages(thread)],
        "runs": [run_summary_payload(run) for run in thread_runs(thread)],
    }


def post_as_caller(request: HttpRequest, thread_id: str | None, text: str, **options: object):
    """`post_message` as the request's user, its refusals as the API's JSON 4xx (the threads
    API and the chat)."""
    try:
        return post_message(
            thread_id,
            text,
            user=request.user,
            traceparent=request.headers.get("traceparent"),
            **options,  # type: ignore[arg-type]
        )
    except ThreadRefused as exc:
        raise BadRequest(str(exc), exc.status, **exc.extra) from None
    except UnknownAgent as exc:
        raise BadRequest(str(exc), 404) from None
    except ValueError as exc:
        raise BadRequest(f"invalid input: {exc}") from None


def start_thread(request: HttpRequest, body: dict) -> tuple[dict, int]:
    """`POST /api/runs` with `"thread"`: the thread's first message is `input.message` (a repeat
    with the same Idempotency-Key is the same run)."""
    run_input = dict(body.get("input", {}))
    text = run_input.get("message")
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("'input.message' is required to start a thread (its first message)")
    key = request.headers.get("Idempotency-Key") or None
    if key is not None and (len(key) > 200 or not key.isprintable()):
        raise BadRequest("Idempotency-Key must be at most 200 printable characters")
    posted = post_as_caller(
        request,
        None if body["thread"] is True else body["thread"],  # None: an id of ours
        text,
        agent=body["agent"],
        run_input=run_input,
        client_id=key,
        priority=body.get("priority", 0),
    )
    payload = {**run_payload(posted.run, []), "thread": posted.thread.id}
    return payload, 201 if posted.created else 200


def posted_message(messages: list[dict], posted: Posted) -> dict | None:
    """The posted message among the thread's: its turn's, or the reply a waiting run took
    (`reply-<wait id>` until that run ends and stores it in the history as its own entry)."""
    run_id = str(posted.run.id)
    ours = [m for m in messages if m["run_id"] == run_id and m["author"] != "agent"]
    if posted.reply is None:
        return ours[0] if ours else None
    replied = posted.reply.payload if isinstance(posted.reply.payload, dict) else {}
    by_id = [m for m in ours if m["id"] == f"reply-{posted.reply.id}"]
    stored = [m for m in ours if m["text"] == replied.get("text")]
    return (by_id or stored[-1:] or [None])[0]


@endpoint(
    "POST",
    "/threads/{thread_id}/messages",
    summary="Add a message to a thread: its run answers with the whole conversation",
    permission=START,
    path_params=THREAD_PATH,
    body={
        "text": {"type": "string", "minLength": 1, "maxLength": MAX_TEXT_CHARS},
        "multitask": {"type": "string", "enum": list(MULTITASK)},
        "agent": AGENT,  # a new thread's agent
        "from": {"type": "string", "enum": ["customer", "staff"]},
        "input": {"type": "object"},  # more input for the run (a new thread's order id, ...)
        "id": {"type": "string", "minLength": 1, "maxLength": 200},  # the sender's message id
        "priority": PRIORITY,
    },
    required=("text",),
    responses={
        202: (
            "its run was started or queued, or the thread's run waiting for a message resumed "
            "with it (a repeat of the message's id: the same run)"
        ),
        400: "bad input",
        403: "no right to start runs",
        404: "no such thread (a first message names its agent) or agent",
        409: '"multitask": "reject" and the thread has an active run; or another agent\'s thread',
    },
    tags=("threads",),
    returns=POSTED,
    headers={"traceparent": TRACEPARENT},
    example={"text": "Where is my refund?", "agent": "refund", "input": {"order_id": "ORD-1001"}},
)
def post_thread_message(request: HttpRequest, thread_id: str, body: dict) -> tuple[dict, int]:
    posted = post_as_caller(
        request,
        thread_id,
        body["text"],
        agent=body.get("agent"),
        author=body.get("from", "customer"),
        multitask=body.get("multitask", "enqueue"),
        client_id=body.get("id"),
        run_input=body.get("input"),
        priority=body.get("priority", 0),
    )
    thread = thread_payload(posted.thread)
    message = posted_message(thread["messages"], posted)
    viewer = request.user.has_perm(VIEW)
    own_run = posted.run.created_by_id == request.user.pk
    payload = {
        "run": run_payload(posted.run, []) if viewer or own_run else None,
        "message": message,
        "thread": thread if viewer else None,  # posting is not reading (`view_run`)
        "run_id": str(posted.run.id),
    }
    return payload, 202  # accepted: the run answers it (a repeat of the same id: the same run)


@endpoint(
    "GET",
    "/threads/{thread_id}",
    summary="A thread: its messages (who said what, when) and its runs",
    permission=VIEW,
    path_params=THREAD_PATH,
    responses={200: "the thread", 404: "no such thread"},
    tags=("threads",),
    returns=THREAD,
)
def thread_detail(request: HttpRequest, thread_id: str) -> dict:
    thread = get_thread(thread_id)
    if thread is None:
        raise BadRequest("no such thread", 404)
    return thread_payload(thread)
