"""The AI SDK chat endpoint (DESIGN.md 5 and 6): any `useChat` front end drives durable runs.

    POST /api/chat/<agent>                      the AI SDK chat request -> the UI message stream
    GET  /api/chat/<agent>/<chat id>/stream     resume (?startIndex=N); 204 when no run
    POST /api/chat/<agent>/<chat id>/stop       the stop button: the chat's run stops now

A chat is a conversation (issue 33): the chat id is its thread's id (`services/threads.py`), the
thread of the user whose first message made it, and each user message is the next run of the
thread, given the whole history: the first POST starts the thread with the last user message's
text as the agent's `message` (over the request's `input` object), each later message continues
it (queued behind a turn still running). A repeated POST of the same user message (its `id`, or
its place among the user messages: a double submit, a retry after a dropped connection,
`regenerate-message`) streams the same run from its first chunk. The chat's UI message stream
spans its runs with one chunk cursor (`stream/ui_thread.py`): each response says where its
first chunk is in it (`x-chat-chunk-offset`), and a resume with `startIndex` counts across the
chat's turns. A chat begun before chats were threads (its one run found by the `dedupe_key`
"chat:<user id>:<chat id>") is still streamed, and refuses a second message as it did. A POST whose last assistant message holds tool parts in state
`approval-responded` decides those approvals as the caller, through the inbox's one decision
(the runtime's inbox port: permission, limits, "already decided"), and streams the continuation of the same assistant
message: the chunks after the stop that asked for them. If somebody else decided first, the
continuation shows what they decided (`tool-approval-response`, then the output or
`tool-output-denied`) instead of an error: the chat then agrees with the inbox.

Who may do what: watching a chat's run needs `agentruns.view_run` (as the run page and its
socket do), starting one `agentruns.start_run` as well, answering an approval
`approvals.decide_approval` and `approvals.view_approval` as well. Session callers send the CSRF
token; scripts a bearer token. Unknown extra fields of the request body are ignored (front ends add their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from agentruns import selectors
from agentruns.api.conversations.threads import post_as_caller
from agentruns.api.endpoint import endpoint
from agentruns.api.parsing import BadRequest
from agentruns.api.runs import CHAT_KEY_PREFIX, REASON, STOP_RESPONSES, stopped
from agentruns.api.schemas import PRIORITY, RUN, TRACEPARENT
from agentruns.models import Run, Thread
from agentruns.runtime.inbox import Refused, inbox
from agentruns.runtime.values.ids import BadId, parse_versioned_id
from agentruns.selectors import threads as selectors_threads
from agentruns.stream import ui_questions, ui_thread
from agentruns.stream.ui_stream import chunks_until_now, ui_message_stream_response

VIEW = "agentruns.view_run"
START = "agentruns.start_run"
DECIDE = "approvals.decide_approval"
VIEW_APPROVAL = "approvals.view_approval"
MAX_MESSAGE_CHARS = 5000

AGENT = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,100}$"}
# the AI SDK's generateId() and UUIDs; "." and ".." can never be path segments
CHAT_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9_.:-]{0,127}$"}
PART = {
    "type": "object",
    "properties": {"type": {"type": "string", "maxLength": 200}},
    "required": ["type"],
}
UI_MESSAGE = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "maxLength": 200},
        "role": {"type": "string", "enum": ["system", "user", "assistant"]},
        "parts": {"type": "array", "maxItems": 1000, "items": PART},
    },
    "required": ["role", "parts"],
}
CHAT_REQUEST = {
    "type": "object",
    "properties": {
        "id": CHAT_ID,
        "messages": {"type": "array", "minItems": 1, "maxItems": 1000, "items": UI_MESSAGE},
        "trigger": {"type": "string", "enum": ["submit-message", "regenerate-message"]},
        "messageId": {"type": ["string", "null"], "maxLength": 200},
        "input": {"type": "object"},
        "priority": PRIORITY,  # of the run a new chat starts
    },
    "required": ["id", "messages"],
    "additionalProperties": True,
}


def chat_dedupe_key(chat_id: str, user: Any) -> str:
    """A chat id is its user's own: `chat:<user id>:<chat id>`, in a namespace the API's
    Idempotency-Key may not use (agentruns.api.runs), so neither another user's chat of the same
    id nor an API run started with the key `chat:<id>` is ever this chat's run."""
    return f"{CHAT_KEY_PREFIX}{user.pk}:{chat_id}"


def chat_run(agent: str, chat_id: str, user: Any) -> Run | None:
    """The run of this user's chat; a chat begun before chat keys were per user (`chat:<id>`)
    is found only by the user who started it."""
    run = selectors.run_by_dedupe_key(agent, chat_dedupe_key(chat_id, user))
    if run is None:
        legacy = selectors.run_by_dedupe_key(agent, f"{CHAT_KEY_PREFIX}{chat_id}")
        if legacy is not None and legacy.created_by_id == user.pk:
            return legacy
    return run


def chat_thread(agent: str, chat_id: str, user: Any) -> Thread | None:
    """The chat's thread (the chat id is the thread id), if this user's chat with this agent
    made it: a chat is its user's own (another user's chat of the same id is not theirs to read
    or continue)."""
    return own_thread(selectors_threads.get_thread(chat_id), agent, user)


def own_thread(thread: Thread | None, agent: str, user: Any) -> Thread | None:
    if thread is None or thread.created_by_id != user.pk or thread.agent != agent:
        return None
    return thread


def latest_run(thread: Thread) -> Run | None:
    runs = selectors_threads.thread_runs(thread)
    return runs[-1] if runs else None


def with_offset(response: HttpResponseBase, start: int) -> HttpResponseBase:
    """The chat-wide index of the run's first chunk (a client's cursor across turns)."""
    response["x-chat-chunk-offset"] = str(start)
    return response


def thread_stream(run: Run, runs: list[Run]) -> HttpResponseBase:
    """The run's UI message stream from its first chunk, with its offset in the chat's cursor
    (`runs`: the thread's runs)."""
    return offset_in(ui_message_stream_response(run, 0), runs, run)


def offset_in(response: HttpResponseBase, runs: list[Run], run: Run) -> HttpResponseBase:
    """`response` (a stream of `run`) with the chat-wide index of the run's first chunk."""
    return with_offset(response, ui_thread.offsets(runs)[runs.index(run)] if run in runs else 0)


def user_message_id(messages: list[dict]) -> str:
    """The last user message's own id (a repeated POST of it is the same turn), or its place."""
    users = [m for m in messages if m.get("role") == "user"]
    given = users[-1].get("id") if users else None
    return given if isinstance(given, str) and given else f"#{len(users)}"


def require(request: HttpRequest, *permissions: str) -> None:
    for permission in permissions:
        if not request.user.has_perm(permission):
            raise BadRequest(f"permission denied: {permission} is required", 403)


def last_user_text(messages: list[dict]) -> str:
    """The text parts of the last user message, joined (what the agent gets as `message`)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            texts = [
                p["text"]
                for p in message["parts"]
                if p.get("type") == "text" and isinstance(p.get("text"), str)
            ]
            return "\n".join(texts).strip()
    return ""


MAX_ANSWERS = 20  # distinct approvals answered by one request (each is its own decision)


@dataclass(frozen=True)
class Answer:
    approval_id: int
    version: int  # of the proposal the chat showed: "14" is version 1, "14.3" version 3
    asked_as: str  # the approvalId as the stream sent it
    approved: bool
    reason: str


def approval_responses(messages: list[dict]) -> list[Answer]:
    """The answers in the tool parts in state `approval-responded` of the last assistant
    message, in order, one per approval: repeats of an answer collapse, contradicting answers
    and more than MAX_ANSWERS approvals are a 400, as is a malformed part (named)."""
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    if last is None:
        return []
    answers: dict[int, Answer] = {}
    for position, part in enumerate(last["parts"]):
        kind = str(part.get("type", ""))
        if not (kind.startswith("tool-") or kind == "dynamic-tool"):
            continue
        if part.get("state") != "approval-responded":
            continue
        approval = part.get("approval")
        where = f"the assistant message's part {position} ({kind})"
        if not isinstance(approval, dict) or not isinstance(approval.get("approved"), bool):
            raise BadRequest(f"{where}: approval.approved must be true or false")
        raw_id, reason = approval.get("id"), approval.get("reason") or ""
        try:
            if not isinstance(raw_id, str):
                raise BadId(raw_id)
            approval_id, version = parse_versioned_id(raw_id, what="approval.id")
        except BadId:
            raise BadRequest(f"{where}: approval.id {raw_id!r} is not one of this app's") from None
        if not isinstance(reason, str) or len(reason) > 2000:
            raise BadRequest(f"{where}: approval.reason must be a string of at most 2000")
        answer = Answer(approval_id, version or 1, raw_id, approval["approved"], reason)
        earlier = answers.setdefault(approval_id, answer)
        if earlier != answer:
            raise BadRequest(f"{where}: a second, different answer for approval {approval_id}")
        if len(answers) > MAX_ANSWERS:
            raise BadRequest(f"at most {MAX_ANSWERS} approvals may be answered at once")
    return list(answers.values())


def decide(request: HttpRequest, run: Run, answers: list[Answer]) -> tuple[int, bool]:
    """Apply the chat's answers as the caller's decisions, all or none; returns the chunk index
    the continuation starts at, and whether an answer was to an older version of its proposal
    (nothing was decided then: the continuation asks again with the current one)."""
    stale = False
    require(request, DECIDE, VIEW_APPROVAL)
    with transaction.atomic():
        for answer in answers:
            approval_id, approved, reason = answer.approval_id, answer.approved, answer.reason
            try:
                # decided first elsewhere (or a repeated POST): the stream shows the outcome
                outcome = inbox().answer(
                    run,
                    approval_id,
                    approved=approved,
                    user=request.user,
                    reason=reason,
                    version=answer.version,
                )
            except Refused as exc:  # the inbox's status: 400/403/404/409/422
                extra = {"code": exc.code} if exc.code else {}
                raise BadRequest(str(exc), exc.status, **extra) from None
            except PermissionDenied as exc:  # a rule of who may decide (e.g. not the starter)
                raise BadRequest(str(exc) or "you may not decide this approval", 403) from None
            # stale: the stream re-asked with the new proposal; the chat shows it
            stale = stale or outcome == "stale"
    fold = chunks_until_now(run)
    starts = [
        fold.continuation_of_request(answer.asked_as)
        if answer.asked_as in fold.request_chunks
        else fold.continuation_index(answer.approval_id)
        for answer in answers
    ]
    known = [index for index in starts if index is not None]
    if stale:  # from the first re-ask the chat did not see
        return (min(known) if known else fold.count), True
    return (max(known) if known else fold.count), False


@endpoint(
    "POST",
    "/chat/{agent}",
    summary="The AI SDK chat request: start (or continue) the chat's run, stream its UI messages",
    path_params={"agent": AGENT},
    body=CHAT_REQUEST,
    session_writes=True,
    streams=True,
    responses={
        200: "the UI message stream (text/event-stream), header x-run-id",
        400: "bad request",
        403: "no right to start, watch or decide",
        404: "no such agent or approval",
        409: "another user's chat id, or (a chat from before threads) another message",
        422: "the decision is not acceptable",
    },
    tags=("chat",),
    headers={"traceparent": TRACEPARENT},
)
def chat(request: HttpRequest, agent: str, body: dict) -> HttpResponseBase:
    require(request, VIEW)
    messages: list[dict[str, Any]] = body["messages"]
    answers = approval_responses(messages)
    if answers:  # the right to answer comes before looking for the chat's run
        require(request, DECIDE, VIEW_APPROVAL)
    found = selectors_threads.get_thread(body["id"])  # (another user's or agent's: refused)
    thread = own_thread(found, agent, request.user)
    if thread is not None:
        run = latest_run(thread)
    elif found is None:  # a chat begun before chats were threads has a run and no thread
        run = chat_run(agent, body["id"], request.user)
    else:
        run = None
    questions = ui_questions.asked_in(run, ui_questions.tool_outputs(messages)) if run else {}
    if questions:  # a question answered with addToolOutput: the same rights as an approval
        require(request, DECIDE, VIEW_APPROVAL)
        try:
            response = ui_message_stream_response(run, ui_questions.answer(request, run, questions))
        except Refused as exc:
            extra = {"code": exc.code} if exc.code else {}
            raise BadRequest(str(exc), exc.status, **extra) from None
        if thread is not None:
            offset_in(response, selectors_threads.thread_runs(thread), run)
        return response
    if run is not None and answers:
        start, stale = decide(request, run, answers)
        response = ui_message_stream_response(run, start)
        if thread is not None:
            offset_in(response, selectors_threads.thread_runs(thread), run)
        if stale:  # what scripts read: nothing was decided, the stream asks again
            response["x-decision-status"] = "409"
        return response
    if answers:
        raise BadRequest("this chat has no run: there is no approval to answer", 404)
    text = last_user_text(messages)
    if thread is None and run is not None:  # a chat begun before chats were threads
        if text and text != str(run.input.get("message", text)):
            raise BadRequest(
                "this chat began before chats were conversations (one chat id is one run): "
                "start a new chat for a new request",
                409,
                run_id=str(run.id),
            )
        return ui_message_stream_response(run, 0)
    require(request, START)
    if thread is None and found is not None:
        raise BadRequest(
            "this chat id is another user's chat, or a chat with another agent: start a new chat",
            409,
        )
    if not text:
        raise BadRequest("the chat needs a user message with text")
    if len(text) > MAX_MESSAGE_CHARS:
        raise BadRequest(f"the message is longer than {MAX_MESSAGE_CHARS} characters")
    posted = post_as_caller(
        request,
        body["id"],
        text,
        agent=agent,
        client_id=user_message_id(messages),
        run_input=body.get("input", {}),
        priority=body.get("priority", 0),
        chat=True,
    )
    return thread_stream(posted.run, selectors_threads.thread_runs(posted.thread))


@endpoint(
    "GET",
    "/chat/{agent}/{chat_id}/stream",
    summary="Resume a chat's UI message stream from chunk startIndex (204: the chat has no run)",
    permission=VIEW,
    path_params={"agent": AGENT, "chat_id": CHAT_ID},
    query={"startIndex": {"type": "integer", "minimum": 0}},
    responses={200: "the UI message stream from startIndex on", 204: "the chat has no run"},
    streams=True,
    tags=("chat",),
)
def chat_stream(
    request: HttpRequest,
    agent: str,
    chat_id: str,
    startIndex: int | None = None,  # noqa: N803  (the AI SDK's name for it)
) -> HttpResponseBase:
    thread = chat_thread(agent, chat_id, request.user)
    if thread is not None:
        runs = selectors_threads.thread_runs(thread)
        if startIndex is None:  # the AI SDK's reconnect: the latest turn, from its start
            return thread_stream(runs[-1], runs)
        run, local, start = ui_thread.locate(runs, startIndex)
        return with_offset(ui_message_stream_response(run, local), start)
    run = chat_run(agent, chat_id, request.user)
    if run is None:
        return HttpResponse(status=204)
    return ui_message_stream_response(run, startIndex or 0)


@endpoint(
    "POST",
    "/chat/{agent}/{chat_id}/stop",
    summary="Stop the chat's run (the chat's stop button); its stream ends with abort + finish",
    permission=VIEW,
    path_params={"agent": AGENT, "chat_id": CHAT_ID},
    body={"reason": REASON},
    session_writes=True,
    responses=STOP_RESPONSES,
    tags=("chat",),
    returns=RUN,
)
def stop_chat(request: HttpRequest, agent: str, chat_id: str, body: dict) -> dict:
    """The AI SDK's `stop()` only drops the client's fetch: a front end calls this beside it.
    The chat's current turn ends within a second keeping its text so far; resume the stream
    (`GET .../stream?startIndex=N`) to see it end. The chat takes the next message."""
    thread = chat_thread(agent, chat_id, request.user)
    run = latest_run(thread) if thread is not None else chat_run(agent, chat_id, request.user)
    if run is None:
        raise BadRequest("this chat has no run", 404)
    return stopped(request, run, body.get("reason", ""))
