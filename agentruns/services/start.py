"""Starting runs: `start_run` (every door: the API, the form, chat), `execute_inline`
(scripts, benchmarks) and `fork_run`, with the checks every start passes.

Each writes its RunEvent in the same transaction as the change and rings the worker doorbell
(`enqueue`) inside that transaction: with the ORM broker a rolled-back change leaves no task. On
PostgreSQL a start instead NOTIFYs the workers' claimers from the statement that creates the run
(`runtime/dispatch/claims.py`): one statement, no q2 task.
"""

from __future__ import annotations

import json
import uuid
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agentruns.conf import conf
from agentruns.models import PRIORITY_MAX, PRIORITY_MIN, Run, Step
from agentruns.registry import Agent, get_agent
from agentruns.runtime import writer
from agentruns.runtime.access import permissions, quotas, scope
from agentruns.runtime.conversations import history as conversations
from agentruns.runtime.dispatch import claims, concurrency, thread_line
from agentruns.runtime.dispatch.queue import enqueue
from agentruns.runtime.engine.executor import RunExecutor
from agentruns.runtime.events import EventType
from agentruns.runtime.execution import transitions
from agentruns.runtime.store import get_store
from agentruns.runtime.store.base import InFlightCap, InFlightCapReached, InFlightNearCap
from agentruns.runtime.tracing.tracecontext import new_run_trace
from agentruns.runtime.values.ids import actor_name, step_key, worker_id
from agentruns.services import forks

START_PERMISSION = "agentruns.start_run"
# a priority above the default: its own permission, or an operator's
PRIORITY_PERMISSION = "agentruns.set_priority"
OPERATE_PERMISSION = "agentruns.operate_run"


@dataclass
class StartResult:
    run: Run
    created: bool


def check_may_start(user: Any) -> None:
    """Every way a person starts a run (the API, the form, fork, chat) passes here.

    `user=None` is a trusted in-process caller (scripts, benchmarks, crashlab), never a request:
    views always pass `request.user`, and an anonymous one has no permission."""
    if user is not None and not user.has_perm(START_PERMISSION):
        raise PermissionDenied(f"permission denied: {START_PERMISSION} is required to start runs")


def check_input_size(run_input: dict) -> None:
    """Each value of a run's input at most AGENTRUNS_INPUT_MAX_KEY_BYTES as JSON (ValueError):
    an agent without a schema, or one whose schema allows any extra key, still gets no
    megabyte-sized field into every model prompt, search row and page."""
    cap = conf.INPUT_MAX_KEY_BYTES
    if cap <= 0:
        return
    for key, value in run_input.items():
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8", "replace"))
        if size > cap:
            raise ValueError(f"{str(key)[:100]}: {size} bytes as JSON, at most {cap} per key")


def check_priority(priority: Any) -> int:
    """A run's priority: a whole number from PRIORITY_MIN to PRIORITY_MAX (ValueError)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be a whole number from {PRIORITY_MIN} to {PRIORITY_MAX}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(f"priority must be from {PRIORITY_MIN} to {PRIORITY_MAX}, not {priority}")
    return priority


def may_prioritise(user: Any) -> bool:
    """Whether `user` may start runs above the default priority (0): with
    `agentruns.set_priority`, as an operator, or as the system (no user). Below it anyone may:
    it only lets others go first."""
    if user is None:
        return True
    return user.has_perm(PRIORITY_PERMISSION) or user.has_perm(OPERATE_PERMISSION)


def check_may_prioritise(user: Any, priority: int) -> None:
    """A priority above the default needs `may_prioritise` (PermissionDenied naming it): a
    queued run of a higher priority is claimed before everyone else's."""
    if priority > 0 and not may_prioritise(user):
        raise PermissionDenied(
            f"permission denied: {PRIORITY_PERMISSION} (or {OPERATE_PERMISSION}) is required "
            f"for a priority above 0, not {priority}"
        )


def may_repeat(sender_id: Any, user: Any) -> bool:
    """A repeated key (an Idempotency-Key, a thread message's id) names what its sender made
    only for that sender or the system (no user): another user's key never stands in for yours,
    whatever you may view."""
    return user is None or (sender_id is not None and sender_id == getattr(user, "pk", None))


def key_owner(user: Any) -> str:
    """Whose a dedupe key is (`Run.dedupe_owner`): the starter's pk, "" for the system."""
    return str(user.pk) if getattr(user, "is_authenticated", False) else ""


def start_run(
    agent_name: str,
    run_input: dict,
    *,
    dedupe_key: str | None = None,
    user: Any = None,
    model: str | None = None,
    enqueue_task: bool = True,
    claim_for: str | None = None,
    traceparent: str | None = None,
    priority: int = 0,
    thread_id: str | None = None,
) -> StartResult:
    """Create and enqueue a run; a repeated (agent, dedupe_key) of the same starter returns the
    existing run (a key is its starter's: another user's same key starts their own run).

    The unique constraint decides between concurrent starts, not a pre-check.
    `traceparent`: the caller's W3C trace context; the run's trace continues it (an invalid one
    is ignored, as the W3C spec says: a new trace starts).
    `claim_for`: create it already running under that worker's lease instead of enqueueing it
    (`execute_inline`); if that worker dies, the sweeper hands the run to the queue.
    `priority`: higher is claimed first among queued runs. An agent with a concurrency key
    admits the run or puts it in its key's line, in the transaction that creates it
    (`runtime/dispatch/concurrency.py`). `thread_id`: a turn of that thread (`services/threads.py`,
    which holds the thread's row lock): it waits in the thread's line while an earlier run of the
    thread has not ended, and takes its key when its turn comes (`dispatch/thread_line.py`).
    """
    check_may_start(user)
    agent = get_agent(agent_name)
    agent.validate_input(run_input)
    check_input_size(run_input)
    check_priority(priority)
    check_may_prioritise(user, priority)
    concurrency_key = concurrency.key_for(agent_name, run_input)
    run_scope = scope.scope_at_start(agent_name, run_input)
    owner = key_owner(user)
    if dedupe_key is not None:
        existing = Run.objects.filter(
            agent=agent_name, dedupe_owner=owner, dedupe_key=dedupe_key
        ).first()
        if existing is not None:
            return StartResult(existing, False)
    # a repeat (above) starts nothing, so it costs no quota; the insert checks the in-flight cap
    in_flight = quotas.take_start(user)
    # a start alone in its own transaction need not wait for the user's other starts while far
    # below the cap (store/pg_function.py); near it the insert says so and it starts again,
    # counting exactly
    alone = in_flight is not None and not connection.in_atomic_block and thread_id is None
    asked = NewRun(
        agent=agent,
        run_input=run_input,
        user=user,
        model=model,
        enqueue_task=enqueue_task and claim_for is None,
        claim_for=claim_for,
        traceparent=traceparent,
        priority=priority,
        thread_id=thread_id,
        dedupe_key=dedupe_key,
        owner=owner,
        concurrency_key=concurrency_key,
        scope=run_scope,
    )
    try:
        try:
            return _create(asked, replace(in_flight, shared=True) if alone else in_flight)
        except InFlightNearCap:
            return _create(asked, in_flight)
    except InFlightCapReached:
        raise quotas.refused_in_flight(user, in_flight) from None
    except IntegrityError:
        if dedupe_key is None:
            raise
        repeat = Run.objects.get(agent=agent_name, dedupe_owner=owner, dedupe_key=dedupe_key)
        return StartResult(repeat, False)


@dataclass(frozen=True)
class NewRun:
    """A start that passed its checks: what `_create` builds the run from (again, from scratch,
    when a start far below its in-flight cap finds itself near it after all)."""

    agent: Agent  # the registered agent (`get_agent`): its `name` is the run's
    run_input: dict
    user: Any
    model: str | None
    enqueue_task: bool  # False: executed in this process (`claim_for`, benchmarks, scripts)
    claim_for: str | None
    traceparent: str | None
    priority: int
    thread_id: str | None
    dedupe_key: str | None
    owner: str
    concurrency_key: str | None
    scope: Any


def _create(asked: NewRun, in_flight: InFlightCap | None) -> StartResult:
    """`start_run`'s run, built and inserted (with its line's place, its lease or its
    doorbell) in one transaction, or in one statement when nothing else goes with it."""
    agent, user, now = asked.agent, asked.user, timezone.now()
    searched = (str(asked.run_input.get(field, "")) for field in agent.search_fields)
    run = Run(
        agent=agent.name,
        input=asked.run_input,
        dedupe_key=asked.dedupe_key,
        dedupe_owner=asked.owner if asked.dedupe_key is not None else "",
        model=asked.model or agent.model or conf.MODEL,
        tool_snapshot={t.name: t.policy() for t in agent.tool_objects()},
        permissions=permissions.snapshot(user, agent.tools),
        max_steps=agent.max_steps or conf.DEFAULT_MAX_STEPS,
        retry_unknown=agent.retry_unknown,
        token_budget=agent.token_budget,
        deadline_at=now + timedelta(seconds=agent.deadline_seconds)
        if agent.deadline_seconds
        else None,
        search_text=" ".join(searched).strip()[:200],
        created_by=user if getattr(user, "is_authenticated", False) else None,
        enqueued_at=now,
        priority=asked.priority,
        concurrency_key=asked.concurrency_key,
        scope=asked.scope,
    )
    run.trace_id, run.trace_parent = new_run_trace(asked.traceparent)
    events = [
        (EventType.RUN_CREATED, {"agent": agent.name, "by": actor_name(user), "status": "queued"})
    ]
    store = get_store()
    # PostgreSQL: the creating statement NOTIFYs the workers' claimers instead of ringing a q2
    # doorbell (runtime/dispatch/claims.py); the sweeper's doorbell catches a NOTIFY nobody heard
    notify = asked.enqueue_task and claims.starts_by_notify()
    # one statement needs no transaction of its own; inside the caller's, a savepoint keeps a
    # dedupe conflict from breaking it (a keyed start locks its key first: a transaction)
    single = (
        store.create_is_one_statement
        and (notify or not asked.enqueue_task)
        and not connection.in_atomic_block
        and asked.concurrency_key is None
        and asked.thread_id is None
    )
    with nullcontext() if single else transaction.atomic():
        placed = thread_line.place(run, asked.thread_id) if asked.thread_id is not None else []
        events += placed
        if asked.concurrency_key is not None and not placed:
            events += concurrency.admit_new(run, concurrency.declared_limit(agent.name), now)
        admitted = run.waiting_behind is None  # in a line: no lease, no doorbell
        if asked.claim_for is not None and admitted:
            events += _leased(run, asked.claim_for, now)
        run.last_seq = writer.create_run(
            run,
            events,
            owner=run.lease_owner or None,
            now=now,
            notify=claims.CHANNEL if notify and admitted else None,
            in_flight=in_flight,
        )
        if asked.enqueue_task and not notify and admitted:
            enqueue(run.id)
    return StartResult(run, True)


def _leased(run: Run, owner: str, now: Any) -> list:
    """The new run already running under `owner`'s lease (`execute_inline`): its events."""
    started = transitions.started()
    started.apply_to(run)
    run.lease_owner, run.started_at = owner, now
    run.lease_expires_at = now + timedelta(seconds=conf.LEASE_TTL_SECONDS)
    run.enqueued_at = None
    return started.events


def execute_inline(agent_name: str, run_input: dict, **start: Any) -> tuple[Run, str]:
    """Start a run and execute it in this process, with no queue in between (scripts, benchmarks).

    The run is created already running under this process's lease (one statement on
    PostgreSQL), so no worker takes it meanwhile; if this process dies, the lease expires and the
    sweeper hands the run to the queue like any other. Returns (run, outcome of `advance`); a
    run that waits in its concurrency key's line is left to the workers ("queued")."""
    owner = worker_id()
    result = start_run(agent_name, run_input, claim_for=owner, **start)
    if not result.created or result.run.lease_owner != owner:  # deduplicated, or in a line
        return result.run, result.run.status
    return result.run, RunExecutor(result.run.id, owner).advance(claimed=result.run)


# the step fields a fork copies as history (ids, run and idempotency keys are new)
_FORK_STEP_FIELDS = (
    "index",
    "kind",
    "tool",
    "call_id",
    "arguments",
    "status",
    "approved",
    "result",
    "error",
    "attempts",
    "text",
    "tool_calls",
    "prompt_tokens",
    "completion_tokens",
    "started_at",
    "finished_at",
)


def fork_run(
    run_id: uuid.UUID | str, from_step: int, *, user: Any = None, approve_repeats: bool = True
) -> Run:
    """A new run with the source's history before step `from_step`, continuing from there.

    The cut must be at a model step, so the history ends with every tool call answered (a model
    turn whose tool results are missing is not a valid conversation). Copied steps are history,
    never executed: they keep their results but get new ids and new idempotency keys (the unique
    key belongs to the source step), and the new run's model turn N is asked afresh.
    Forking starts a run: it needs `start_run`, and the fork's permissions are the forking
    user's (a trainee's fork of a lead's run gets a trainee's tools), with the tools of the
    source's side effects at and after the cut under approval (`forks.py`; `approve_repeats=False`
    leaves them to their own rules, except a call whose outcome is unknown).
    """
    check_may_start(user)
    in_flight = quotas.take_start(user)
    try:
        return _fork(run_id, from_step, user, approve_repeats, in_flight)
    except InFlightCapReached:
        raise quotas.refused_in_flight(user, in_flight) from None


def _fork(
    run_id: uuid.UUID | str,
    from_step: int,
    user: Any,
    approve_repeats: bool,
    in_flight: InFlightCap | None,
) -> Run:
    with transaction.atomic():
        source = Run.objects.get(id=run_id)
        fork_plan = forks.plan(source, from_step, approve_repeats=approve_repeats)
        history = fork_plan.history
        now = timezone.now()
        who = actor_name(user)
        fork = Run(
            agent=source.agent,
            input=source.input,
            model=source.model,
            tool_snapshot=source.tool_snapshot,
            permissions=permissions.require_approval(
                permissions.snapshot(user, source.tool_snapshot),
                source.tool_snapshot,
                fork_plan.approval_for,
            ),
            retry_unknown=source.retry_unknown,
            max_steps=max(source.max_steps, from_step + conf.DEFAULT_MAX_STEPS),
            token_budget=source.token_budget,
            deadline_at=(
                now + (source.deadline_at - source.created_at) if source.deadline_at else None
            ),
            search_text=source.search_text,
            created_by=user if getattr(user, "is_authenticated", False) else None,
            step_count=len(history),
            prompt_tokens=sum(s.prompt_tokens for s in history),
            completion_tokens=sum(s.completion_tokens for s in history),
            enqueued_at=now,
            trace_id=new_run_trace(None)[0],  # a trace of its own (the fork event names the source)
            priority=source.priority,
            concurrency_key=source.concurrency_key,  # the same input: the same key
            scope=source.scope,  # and what it is about
        )
        # a thread's run: the fork continues a fork of the thread (its first run), sharing its
        # history
        forked_thread = conversations.fork_thread(source, user=user)
        if forked_thread is not None:
            fork.thread_id = forked_thread.id
        # a fork takes its key like any start: admitted, or at the end of the key's line
        waiting = (
            concurrency.admit_new(fork, concurrency.declared_limit(fork.agent), now)
            if fork.concurrency_key is not None
            else []
        )
        fork.save(force_insert=True)
        if forked_thread is not None:
            conversations.add_fork_turn(source, fork, forked_thread)
        quotas.hold_in_flight(in_flight)  # exact under concurrency, as `create_run` is
        copies = []
        for step in history:
            new_id = uuid.uuid4()
            copies.append(
                Step(
                    id=new_id,
                    run=fork,
                    idempotency_key=step_key(fork.id, new_id),
                    **{name: getattr(step, name) for name in _FORK_STEP_FIELDS},
                )
            )
        writer.copy_steps(copies)
        writer.append(
            fork.id,
            [
                (
                    EventType.RUN_CREATED,
                    {
                        "agent": fork.agent,
                        "by": who,
                        "status": "queued",
                        "forked_from": str(source.id),
                        "from_step": from_step,
                        "approve_repeats": approve_repeats,
                        "repeats": [repeat.payload() for repeat in fork_plan.repeats],
                    },
                ),
                *waiting,
            ],
        )
        writer.append(
            source.id,
            [(EventType.RUN_FORKED, {"by": who, "into": str(fork.id), "from_step": from_step})],
        )
        if fork.waiting_behind is None:
            enqueue(fork.id)
    return fork
