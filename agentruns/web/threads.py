"""The run page's thread (issue 33): the conversation the run is a turn of, who said what and
when, and the form staff add a message with (the same service as the API's
`POST /api/threads/<id>/messages`: the message is the thread's next run)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required, permission_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from agentruns.models import Author, Run
from agentruns.selectors.threads import thread_messages, thread_of_run
from agentruns.services.actions import may_stop
from agentruns.services.threads import (
    MAX_TEXT_CHARS,
    ThreadRefused,
    active_runs,
    may_post,
    post_message,
)

START = "agentruns.start_run"
CHOICES = (
    ("enqueue", "when it has finished what it is doing"),
    ("interrupt", "now: stop what it is doing"),
)


def thread_context(run: Run, user: Any, **extra: Any) -> dict:
    """What `_run_thread.html` shows (empty: the run is no thread's turn)."""
    thread = thread_of_run(run)
    if thread is None:
        return {"thread": None}
    active = active_runs(thread)
    # interrupting stops the thread's oldest active run: offered to whoever may stop it
    choices = CHOICES if active and may_stop(user, active[0]) else CHOICES[:1]
    return {
        "run": run,
        "thread": thread,
        "thread_messages": thread_messages(thread),
        # the form only where a post would be taken (a chat is its user's, or an operator's)
        "can_post": may_post(thread, user),
        "multitask_choices": choices,
        "max_chars": MAX_TEXT_CHARS,
        **extra,
    }


@require_POST
@login_required
@permission_required(START, raise_exception=True)
def thread_message(request: HttpRequest, run_id: Any) -> HttpResponse:
    """Staff add a message to the thread of this run (the thread's next run, or the reply a run
    of it waits for); HTMX gets the thread again."""
    run = get_object_or_404(Run, id=run_id)
    thread = thread_of_run(run)
    if thread is None:
        return HttpResponse("this run is no thread's turn", status=404)
    multitask = request.POST.get("multitask", "enqueue")
    status, extra = 200, {}
    try:
        posted = post_message(
            thread.id,
            request.POST.get("text", ""),
            user=request.user,
            author=Author.STAFF,
            multitask=multitask if multitask in dict(CHOICES) else "enqueue",
        )
        extra["posted"], extra["replied"] = posted.run, posted.reply is not None
    except (ThreadRefused, ValueError) as exc:
        status, extra["thread_error"] = getattr(exc, "status", 400), str(exc)
    if not request.htmx:
        if "posted" in extra:
            return redirect("run-detail", run_id=extra["posted"].id)
        return HttpResponse(extra["thread_error"], status=status, content_type="text/plain")
    context = thread_context(run, request.user, **extra)
    return render(request, "agentruns/_run_thread.html", context, status=status)
