"""Run pages: the list, the detail timeline, and the operator actions.

Each page needs the permission the JSON API needs for the same data: `view_run` to look,
`start_run` to start (the form; fork needs it too, checked by the service), `operate_run` to
retry, cancel, resolve and fork. Signed out: a redirect to the login page; signed in without the
permission: 403.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from agentruns import services
from agentruns.models import PRIORITY_MAX, PRIORITY_MIN, Run, RunEvent, RunStatus, Step, StepAttempt
from agentruns.registry import Agent, all_agents
from agentruns.registry.outcomes import tones
from agentruns.runtime.execution import unknown_outcomes
from agentruns.runtime.values.ids import parse_id
from agentruns.runtime.values.text import UnsafeValue, loads_strict
from agentruns.selectors import AGES, RunFilters, backoff_of, live_turns, run_page, waiting_line
from agentruns.selectors.waiting import KINDS as WAIT_KINDS
from agentruns.selectors.waiting import waiting_for
from agentruns.web import run_view
from agentruns.web.forms.inputs import input_fields, input_from_form
from agentruns.web.forms.tokens import FIELD as TOKEN_FIELD
from agentruns.web.forms.tokens import dedupe_key_of, new_form_token
from agentruns.web.permissions import permission_view
from agentruns.web.threads import thread_context
from agentruns.web.timeline import legend, timeline_svg, view_steps

VIEW = "agentruns.view_run"
START = "agentruns.start_run"
OPERATE = "agentruns.operate_run"


@login_required
@permission_required(VIEW, raise_exception=True)
def run_list(request: HttpRequest) -> HttpResponse:
    """Newest first, filterable, keyset-paginated: constant queries per page at any table size."""
    filters = RunFilters.from_query(request.GET)
    page = run_page(filters, older=request.GET.get("older", ""), newer=request.GET.get("newer", ""))
    context = {
        "page": page,
        "filters": filters.as_params(),
        "filter_query": urlencode(filters.as_params()),
        "statuses": RunStatus.values,
        "outcomes": sorted(tones(all_agents().values())),
        "agents": sorted(all_agents()),
        "ages": list(AGES),
        "wait_kinds": WAIT_KINDS,
    }
    template = "agentruns/_run_rows.html" if request.htmx else "agentruns/run_list.html"
    return render(request, template, context)


@login_required
@permission_required(VIEW, raise_exception=True)
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("created_by"), id=run_id)
    steps = list(
        Step.objects.filter(run=run)
        .select_related("approval", "approval__decided_by", "approval__claimed_by")
        .prefetch_related(Prefetch("attempt_rows", queryset=StepAttempt.objects.order_by("number")))
        .order_by("index")
    )
    # every read below stops at the last_seq read with the run: the socket resumes after it
    events = list(
        RunEvent.objects.filter(run=run, seq__lte=run.last_seq)
        .exclude(type="model.delta")
        .order_by("seq")
    )
    rows = view_steps(run, steps)
    waiting = waiting_for(run)
    line = waiting_line(run)
    ended = run_view.end_line(run)
    return render(
        request,
        "agentruns/run_detail.html",
        {
            "run": run,
            "steps": rows,
            # where the run stands in one sentence, and why it ended early (if it did)
            "banner": run_view.banner(run, rows, waiting, line, ended),
            "end_line": ended,
            "subject": run_view.subject(run),
            # what a stop would take out of the inbox: the page asks before it does
            "withdraws": run_view.withdrawn_by_stop(rows),
            "events": events,
            "svg": timeline_svg(run, steps),
            "legend": legend(steps),
            # the model text up to run.last_seq: the socket continues after it
            "live_text": live_turns(run.id, run.last_seq),
            "can_operate": request.user.has_perm(OPERATE),
            "can_stop": services.may_stop(request.user, run),
            # steps whose outcome is unknown in a failed run: what retry does with them
            "unknown_steps": [s for s in steps if unknown_outcomes.is_unsettled(s)],
            "can_fork": request.user.has_perm(OPERATE) and request.user.has_perm(START),
            "permissions": permission_view(run),
            "backoff": backoff_of(run, events),
            "waiting_line": line,
            "waiting_for": waiting,
            # the support view: the conversation first, the input as fields, who may act
            "customer_message": run_view.customer_message(run),
            "input_items": run_view.input_items(run, steps),
            "replies": run_view.replies(run, steps),
            "handovers": run_view.handovers(run, steps),
            "who_may_act": run_view.who_may_act(run, request.user),
            "input_json": json.dumps(run.input, indent=2, ensure_ascii=False, default=str),
            # the conversation this run is a turn of (issue 33), oldest message first
            **thread_context(run, request.user),
        },
    )


@login_required
@permission_required(START, raise_exception=True)
def run_new(request: HttpRequest) -> HttpResponse:
    """The start form: the agent's input as fields from its `input_schema` (raw JSON is the
    advanced option, used when filled in), one run per rendered form (its token)."""
    agents = all_agents()
    if request.method == "POST":
        name = request.POST.get("agent", "")
        agent = agents.get(name)
        raw = request.POST.get("input", "").strip()
        try:
            if agent is None:
                raise LookupError(f"unknown agent {name[:100]!r}")
            run_input = _posted_input(agent, raw, request.POST)
            # a page's token makes a double click one run; a form without one (a script) starts
            token = request.POST.get(TOKEN_FIELD)
            key = dedupe_key_of(token) if token is not None else None
            priority = _priority(request.POST.get("priority", ""))
            result = services.start_run(
                name, run_input, dedupe_key=key, user=request.user, priority=priority
            )
        except (ValueError, LookupError, services.ActionRefused, PermissionDenied) as exc:
            messages.error(request, f"Could not start the run: {exc}")
            context = _start_context(agent, request.POST, request.user, raw_json=raw)
            status = 403 if isinstance(exc, PermissionDenied) else 400
            return render(request, "agentruns/run_new.html", context, status=status)
        if not result.created:
            messages.info(request, "This form was already sent: here is the run it started.")
        return redirect("run-detail", run_id=result.run.id)
    agent = agents.get(request.GET.get("agent", "")) or _default_agent(agents)
    context = _start_context(agent, request.GET, request.user)
    if request.htmx:  # the agent changed: its fields
        return render(request, "agentruns/_input_fields.html", context)
    return render(request, "agentruns/run_new.html", context)


def _default_agent(agents: dict[str, Agent]) -> Agent | None:
    return agents[min(agents)] if agents else None


def _posted_input(agent: Agent, raw_json: str, posted) -> dict:
    if raw_json:  # the advanced option, filled in: it replaces the fields
        run_input = loads_strict(raw_json, "input")
        if not isinstance(run_input, dict):
            raise ValueError("the input must be a JSON object")
        return run_input
    return input_from_form(agent.input_schema, posted)  # ({} for an agent without fields)


def _start_context(agent: Agent | None, values, user: Any, raw_json: str = "") -> dict:
    return {
        "agents": sorted(all_agents()),
        "agent": agent,
        "fields": input_fields(agent.input_schema if agent else None, values),
        "raw_json": raw_json,
        "form_token": new_form_token(),
        "token_field": TOKEN_FIELD,
        "priority": values.get("priority", 0),
        # above the default only for those who may (`services.may_prioritise`)
        "priority_range": (PRIORITY_MIN, PRIORITY_MAX if services.may_prioritise(user) else 0),
    }


def _priority(raw: str) -> int:
    """The form's priority: empty is 0; anything but a whole number in range is a ValueError."""
    raw = raw.strip()
    if not raw:
        return 0
    if len(raw) > 4 or not raw.lstrip("-").isascii() or not raw.lstrip("-").isdigit():
        raise ValueError(f"priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}")
    return services.check_priority(int(raw))


def _action(request: HttpRequest, run_id, action, done: str, **kwargs) -> HttpResponse:
    run = get_object_or_404(Run.objects.only("id"), id=run_id)
    try:
        action(run.id, user=request.user, **kwargs)
        messages.success(request, done)
    except services.ActionRefused as exc:
        messages.error(request, str(exc))
    return redirect("run-detail", run_id=run.id)


@require_POST
@login_required
@permission_required(OPERATE, raise_exception=True)
def run_retry(request: HttpRequest, run_id) -> HttpResponse:
    return _action(
        request,
        run_id,
        services.retry_run,
        "Retry queued: the failed step runs again as a new attempt with the same idempotency key; "
        "a step whose outcome is unknown is never run again.",
    )


@require_POST
@login_required
@permission_required(OPERATE, raise_exception=True)
def run_cancel(request: HttpRequest, run_id) -> HttpResponse:
    reason = request.POST.get("reason", "").strip()[:500]
    return _action(
        request,
        run_id,
        services.cancel_run,
        "Cancel requested: a running run stops at its next step boundary.",
        reason=reason,
    )


@require_POST
@login_required
def run_stop(request: HttpRequest, run_id) -> HttpResponse:
    """Its starter or an operator: the model turn in flight ends within a second."""
    run = get_object_or_404(Run, id=run_id)  # (its steps' words read its input and policies)
    if request.POST.get("withdraw") != "1" and services.may_stop(request.user, run):
        # a stop withdraws what waits for a person: asked first (a page from before it parked);
        # the stop itself is counted and checked by `stop_for`, as at every other door
        rows = view_steps(run, list(Step.objects.filter(run=run).select_related("approval")))
        withdraws = run_view.withdrawn_by_stop(rows)
        if withdraws:
            return render(
                request,
                "agentruns/stop_confirm.html",
                {"run": run, "withdraws": withdraws, "reason": request.POST.get("reason", "")},
            )
    return _action(
        request,
        run_id,
        services.stop_for,
        "Stopped: the agent's answer in progress ends now, keeping what it said so far; a call "
        "already under way finishes first.",
        reason=request.POST.get("reason", "").strip()[:500],
    )


def _from_step(raw: str) -> int:
    if len(raw) > 9:
        raise ValueError(raw)
    return parse_id(raw, what="step")  # BadId is a ValueError


@require_http_methods(["GET", "POST"])
@login_required
@permission_required(OPERATE, raise_exception=True)
def run_fork(request: HttpRequest, run_id) -> HttpResponse:
    """GET: the fork's confirmation (what it would repeat, and the choice to let those repeats
    run without approval); POST: fork. Without `repeats=allow` the repeats wait for approval."""
    run = get_object_or_404(Run, id=run_id)
    data = request.POST if request.method == "POST" else request.GET
    try:
        from_step = _from_step(data.get("from_step", ""))
        approve_repeats = data.get("repeats", "approve") != "allow"
        if request.method == "GET":
            plan = services.fork_plan(run, from_step)
            return render(request, "agentruns/fork_confirm.html", {"run": run, "plan": plan})
        fork = services.fork_run(
            run.id, from_step, user=request.user, approve_repeats=approve_repeats
        )
    except ValueError:
        messages.error(request, "Choose the model step to fork from.")
    except services.ActionRefused as exc:
        messages.error(request, str(exc))
    else:
        tools = (fork.permissions or {}).get("tools", {})
        held = ", ".join(sorted(name for name, e in tools.items() if e.get("approval_because")))
        messages.success(
            request,
            f"Forked from step #{from_step}: this run continues from there, its history copied."
            + (f" Calls of {held} wait for approval in the inbox." if held else ""),
        )
        return redirect("run-detail", run_id=fork.id)
    return redirect("run-detail", run_id=run.id)


@require_POST
@login_required
@permission_required(OPERATE, raise_exception=True)
def step_resolve(request: HttpRequest, step_id) -> HttpResponse:
    step = get_object_or_404(Step.objects.only("id", "index", "run_id"), id=step_id)
    raw = request.POST.get("result", "").strip() or "{}"
    try:
        result = loads_strict(raw, "result")
        services.resolve_step(step.id, result, user=request.user)
        messages.success(request, f"Step #{step.index} marked resolved; the run continues.")
    except UnsafeValue as exc:
        messages.error(request, f"The result is not valid JSON: {exc}")
    except services.ActionRefused as exc:
        messages.error(request, str(exc))
    return redirect(reverse("run-detail", args=[step.run_id]) + f"#step-{step.index}")
