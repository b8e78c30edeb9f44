"""Run pages: the list, the detail timeline, and the operator actions."""

from __future__ import annotations

import json
from datetime import timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.db.models import Prefetch, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from . import services
from .models import Run, RunEvent, RunStatus, Step, StepAttempt
from .registry import all_agents, get_tool
from .timeline import timeline_svg, view_steps

AGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
PAGE_SIZE = 50


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    runs = Run.objects.only(
        "id", "agent", "status", "input", "error", "stop_reason", "step_count", "created_at",
        "finished_at", "search_text",
    ).order_by("-created_at", "-id")
    status = request.GET.get("status", "")
    agent = request.GET.get("agent", "")
    age = request.GET.get("age", "")
    q = request.GET.get("q", "").strip()
    if status in RunStatus.values:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if age in AGES:
        runs = runs.filter(created_at__gte=timezone.now() - AGES[age])
    if q:
        match = Q(search_text__startswith=q) | Q(search_text__contains=f" {q}")
        try:
            import uuid

            match |= Q(id=uuid.UUID(q))
        except ValueError:
            pass
        runs = runs.filter(match)
    page = Paginator(runs, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "filters": {"status": status, "agent": agent, "age": age, "q": q},
        "statuses": RunStatus.values,
        "agents": sorted(all_agents()),
        "ages": list(AGES),
    }
    template = "agentruns/_run_rows.html" if request.htmx else "agentruns/run_list.html"
    return render(request, template, context)


@login_required
def run_detail(request: HttpRequest, run_id) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("created_by"), id=run_id)
    steps = list(
        Step.objects.filter(run=run)
        .select_related("approval", "approval__decided_by")
        .prefetch_related(Prefetch("attempt_rows", queryset=StepAttempt.objects.order_by("number")))
        .order_by("index")
    )
    events = list(RunEvent.objects.filter(run=run).exclude(type="model.delta").order_by("seq"))
    return render(
        request,
        "agentruns/run_detail.html",
        {
            "run": run,
            "steps": view_steps(run, steps),
            "events": events,
            "svg": timeline_svg(run, steps),
            "live_text": live_text(run),
            "can_operate": request.user.has_perm("agentruns.operate_run"),
        },
    )


def live_text(run: Run) -> list[dict]:
    """The model text so far, per (step, attempt), without superseded attempts."""
    chunks: dict[tuple[int, int], list[str]] = {}
    superseded: set[tuple[int, int]] = set()
    last_seq = 0
    for etype, data, seq in RunEvent.objects.filter(
        run=run, type__in=["model.delta", "model.superseded"]
    ).values_list("type", "data", "seq").order_by("seq"):
        key = (data.get("step"), data.get("attempt"))
        if etype == "model.superseded":
            superseded.add(key)
        else:
            chunks.setdefault(key, []).append(data.get("text", ""))
        last_seq = seq
    return [
        {"step": k[0], "attempt": k[1], "text": "".join(v), "last_seq": last_seq}
        for k, v in chunks.items()
        if k not in superseded
    ]


@login_required
def run_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        agent = request.POST.get("agent", "")
        try:
            run_input = json.loads(request.POST.get("input") or "{}")
            result = services.start_run(agent, run_input, user=request.user)
        except (ValueError, LookupError) as exc:
            messages.error(request, f"Could not start the run: {exc}")
            return render(request, "agentruns/run_new.html", {"agents": sorted(all_agents()), "form": request.POST}, status=400)
        return redirect("run-detail", run_id=result.run.id)
    example = json.dumps({"order_id": "ORD-1001", "message": "The blender arrived broken, please refund."}, indent=2)
    return render(request, "agentruns/run_new.html", {"agents": sorted(all_agents()), "form": {"input": example, "agent": "refund"}})


def _action(request: HttpRequest, run_id, action, done: str) -> HttpResponse:
    try:
        action(run_id, user=request.user)
        messages.success(request, done)
    except services.ActionRefused as exc:
        messages.error(request, str(exc))
    except Run.DoesNotExist:
        messages.error(request, "No such run.")
    return redirect("run-detail", run_id=run_id)


@require_POST
@login_required
@permission_required("agentruns.operate_run", raise_exception=True)
def run_retry(request: HttpRequest, run_id) -> HttpResponse:
    return _action(request, run_id, services.retry_run, "Retry queued: the failed step runs again with the same idempotency key.")


@require_POST
@login_required
@permission_required("agentruns.operate_run", raise_exception=True)
def run_cancel(request: HttpRequest, run_id) -> HttpResponse:
    return _action(request, run_id, services.cancel_run, "Cancel requested.")


@require_POST
@login_required
@permission_required("agentruns.operate_run", raise_exception=True)
def step_resolve(request: HttpRequest, step_id) -> HttpResponse:
    step = get_object_or_404(Step, id=step_id)
    raw = request.POST.get("result", "").strip() or "{}"
    try:
        result = json.loads(raw)
        services.resolve_step(step.id, result, user=request.user)
        messages.success(request, f"Step #{step.index} marked resolved; the run continues.")
    except json.JSONDecodeError as exc:
        messages.error(request, f"The result is not valid JSON: {exc}")
    except services.ActionRefused as exc:
        messages.error(request, str(exc))
    return redirect("run-detail", run_id=step.run_id)


def tool_retry_policy(tool_name: str) -> dict | None:
    try:
        return get_tool(tool_name).retry.describe()
    except LookupError:
        return None
