"""The tool call unit: the tool step the current model step planned for the call's id
(DESIGN.md 4.4, 4.5, 4.10).

Replayed: a step that succeeded returns what it recorded (its `payload`, the CallToolResult; a
step changed by a person, resolved by hand or reconciled as happened: its result). Executed, as
the engine always made tool calls: recovery by the tool's idempotency class for a step a dead
worker left running (`idempotency="none"`: unknown, a reconciliation in the inbox); a
side-effect call commits "running + attempt" (with everything the slice has not committed yet)
before the call and its result after; a transactional tool's writes and its result commit
together; a read-only call's result waits in the pending batch. The call runs with its step as
`current_step()` (a native tool gets its `ToolContext`), failpoints by the tool's name around it.
Failures: a retryable error retries under the tool's policy (a long wait frees the thread), a
fatal one fails the step and the run, a server that could not take the call is weather (no
attempt), an outcome nobody can know is reconciled by a person. `ModelRetry`, `ToolFailed` and
bad arguments are the call's result, fed back to the model by Pydantic AI.
"""

from __future__ import annotations

import json
import traceback
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone
from pydantic_ai.durable_exec import (
    record_durable_unit,
)

from agentruns.conf import conf
from agentruns.models import AttemptOutcome, Step, StepStatus
from agentruns.registry import (
    OutcomeUnknown,
    ServerUnavailable,
    Tool,
    ToolContext,
    UnknownTool,
    get_tool,
)
from agentruns.registry.context import stepping
from agentruns.runtime import tracing, writer
from agentruns.runtime.engine import journal
from agentruns.runtime.engine.journal import (
    BackingOff,
    Cancelled,
    Failed,
    Parked,
    Reconciled,
    journal_unit,
)
from agentruns.runtime.engine.plan import (
    attempt_row,
    begin_attempt,
    crashed,
    end_attempt,
    journal_text,
    replayed,
    stage,
)
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import EventType, step_event_data, succeeded_event_data
from agentruns.runtime.execution import failpoints
from agentruns.runtime.inbox import inbox
from agentruns.runtime.operations import executions
from agentruns.runtime.operations import gate as operations
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.outages.tool_outage import ToolOutage
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.redaction import redact_text, secret_values, secrets_in_scope
from agentruns.runtime.values.text import storable
from agentruns.runtime.values.timestamps import iso

TOOL_RESULT_FIELDS = [
    "status",
    "result",
    "payload",
    "error",
    "attempts",
    "started_at",
    "finished_at",
    "next_attempt_at",
]


# the control flow a tool raised, as Pydantic AI records it: what the step keeps as its result
def recorded(step: Step) -> Any:
    """What a succeeded (or refused) tool step returns on replay (the JSON codec's form)."""
    if step.payload is not None:
        return replayed(step.payload)
    return {"kind": "tool_return", "result": step.result}


def _refuse(state: SliceState, step: Step, reason: str) -> Any:
    """The call is not made: the step ends rejected with `reason`, the model's answer."""
    step.reject(reason)
    stage(state.pending.batch, step, list(Step.REJECTED_FIELDS))
    journal.commit(state, [(EventType.STEP_FAILED, step_event_data(step))])
    record_durable_unit(executed=True)
    return recorded(step)


_GO, _AGAIN = object(), object()


def _open(state: SliceState, step: Step, tool: Tool, attempt: int, started: Any) -> Any:
    """Before the call: its operation key and limit (a gated tool), its "before" commit (a side
    effect outside this database). `_GO`: make the call; `_AGAIN`: the key it waited for was
    settled meanwhile; anything else: the call's answer without it being made."""
    if operations.gated(state.run, tool):
        # the key is taken (and the limit checked) in the "before" commit, with everything the
        # slice has not committed yet: a crash leaves the key held by the step, resumed with it
        with transaction.atomic():
            first = attempt == step.retry_base + 1
            gate = operations.gate(state.run, step, tool, first_attempt=first)
            if gate.go and tool.commits_before_call:
                _begin(state, step, attempt, started, end_transaction=True)
            elif state.pending:
                journal.commit(state, [], end_transaction=True)
        if not gate.go:
            answer = _not_made_by_gate(state, step, gate)
            return _AGAIN if answer is None else answer
    elif tool.commits_before_call:
        _begin(state, step, attempt, started)
    if tool.commits_before_call and state.cancel_requested:
        _not_made(state, step, attempt)  # read by the "before" commit: the call is not made
        raise SliceEnds(journal.end(state, Cancelled()))
    failpoints.hit("step_started", tool=step.tool, step_id=step.id)
    return _GO


def _begin(
    state: SliceState, step: Step, attempt: int, started: Any, *, end_transaction: bool = False
) -> None:
    """The "before" commit: running + attempt, so a crash is seen and resumed by class."""
    step.status = StepStatus.RUNNING
    batch = WriteBatch()
    begin_attempt(batch, step, attempt, state.owner, started)
    journal.commit(
        state,
        [(EventType.STEP_STARTED, step_event_data(step, error=""))],  # not a retry's old one
        batch=batch,
        end_transaction=end_transaction,
    )


def _not_made_by_gate(state: SliceState, step: Step, gate: operations.Gate) -> Any:
    """The gate kept the call from being made: refused (the model reads why), answered with
    the key's earlier execution (the step succeeds with it, marked already done), or the run
    waits for the call that holds the key, holding no thread (None: it was settled meanwhile,
    take it again)."""
    if gate.outcome == operations.REFUSED:
        return _refuse(state, step, gate.reason)
    if gate.outcome == operations.DONE:
        now = timezone.now()
        step.status, step.error, step.next_attempt_at = StepStatus.SUCCEEDED, "", None
        step.result = operations.already_done(gate.key, gate.row)
        step.payload = None  # replayed from its result
        step.started_at, step.finished_at = step.started_at or now, now
        stage(state.pending.batch, step, TOOL_RESULT_FIELDS)
        journal.commit(state, [(EventType.STEP_SUCCEEDED, succeeded_event_data(state.run, step))])
        record_durable_unit(executed=True)
        return recorded(step)
    until = timezone.now() + timedelta(seconds=operations.WAIT_POLL_SECONDS)
    with transaction.atomic():
        if not executions.wait_for(gate.row.id, state.run_id):
            return None
        # on the key's waiters: the run is rung when it settles (its settle waits for this
        # transaction), so the back-off is committed in it
        outcome = journal.back_off(state, until, waiting=gate.reason, operation_key=gate.key)
    raise SliceEnds(outcome)


def _not_made(state: SliceState, step: Step, attempt: int) -> None:
    not_made = "the run was cancelled before the call was made"
    if operations.holds_key(state.run, step.tool):
        with transaction.atomic():  # never made: the key is free again
            executions.settle(step.id, executions.RELEASED)
    now = timezone.now()
    batch = state.pending.batch
    end_attempt(
        batch, step, attempt, finished_at=now, outcome=AttemptOutcome.FAILED, error=not_made
    )
    step.status, step.error, step.finished_at = StepStatus.FAILED, not_made, now
    stage(batch, step, ["status", "error", "finished_at"])
    state.pending.events.append((EventType.STEP_FAILED, step_event_data(step)))


_FED_BACK = {"model_retry": True, "tool_failed": False, "validation_error": True}


async def execute(state: SliceState, kind: str, name: str, ctx: Any, body: Any) -> Any:
    step = state.step_for_call(getattr(ctx, "tool_call_id", None) or "")
    if step is None:  # a call the engine did not plan (a capability's own tool): journaled
        return await journal_unit(state, f"{kind}:{name}", body)
    if step.status in (StepStatus.SUCCEEDED, StepStatus.REJECTED):
        record_durable_unit(executed=False)
        return recorded(step)
    if step.status == StepStatus.FAILED:
        record_durable_unit(executed=False)
        return {"kind": "model_retry", "message": step.error}
    if step.status == StepStatus.SKIPPED:  # a retry skipped its unknown outcome: never made
        record_durable_unit(executed=False)
        return {"kind": "tool_return", "result": {"error": step.error or step.status}}
    if step.status == StepStatus.UNKNOWN:  # a reconciliation is still open: wait for it
        raise await journal.ended(state, Parked())
    if step.status == StepStatus.RUNNING:  # (rare: a worker died mid-call; tracing may read)
        await state.lane.run(_recover, state, step)
    try:
        tool = get_tool(step.tool)
    except UnknownTool:  # a deploy removed it after the call was planned (or approved)
        reason = f"refused: the tool {step.tool} is not deployed any more"
        return await state.lane.run(_refuse, state, step, reason)
    if step.approved:  # fail closed: only the approved arguments run
        refused = await state.lane.run(_approved_refusal, state, step)
        if refused is not None:
            return refused
    if step.next_attempt_at:
        await _wait_for_retry(state, step)
    await journal.check(state, model=False)
    outage: ToolOutage | None = None
    while True:
        try:
            return await _attempt(state, step, tool, body)
        except _Unreachable as down:
            outage = outage or await state.lane.run(ToolOutage.resume, state.run.id, step.index)
            noted = await state.lane.run(_outage_noted, state, step, tool, down, outage)
            if noted is not None:
                await _backed_off(state, noted, outage)
            elif step.next_attempt_at:  # failed for good as an outage, retried by its policy
                await _wait_for_retry(state, step)


def _approved_refusal(state: SliceState, step: Step) -> Any:
    refusal = inbox().approved_call_refusal(step)
    return _refuse(state, step, refusal) if refusal else None


def _recover(state: SliceState, step: Step) -> None:
    """A step left `running` by a dead worker (DESIGN.md 4.5)."""
    policy = state.run.tool_policy(step.tool)
    if policy.get("side_effect") and policy.get("idempotency") == "none":
        raise SliceEnds(journal.end(state, Reconciled(step, "worker died mid-call")))
    crashed(state, step, "worker died mid-call")
    state.pending.events.append((EventType.STEP_RECOVERED, step_event_data(step)))


async def _wait_for_retry(state: SliceState, step: Step) -> None:
    due = step.next_attempt_at
    delay = (due - timezone.now()).total_seconds()
    if state.drain is not None and delay > conf.RETRY_SLEEP_MAX_SECONDS:
        raise await journal.ended(state, BackingOff(due))
    if not await journal.wait_for_retry(state, due):
        raise await journal.ended(state, Cancelled())


def _outage_noted(state: SliceState, step: Step, tool: Tool, down: Any, outage: ToolOutage) -> Any:
    """The call reached nothing: its attempt is undone (the policy's attempts are for the tool's
    own failures) and the step says what it waits on (the time to try again), or, down for
    AGENTRUNS_TOOL_OUTAGE_SECONDS, the step fails (raises the slice's end)."""
    wait = outage.failed(down.error)
    if wait is None:
        _failed(state, step, tool, down.attempt, down.started, outage.verdict(down.error))
        return None
    until = timezone.now() + timedelta(seconds=wait)
    secrets = secret_values([step.arguments], state.run.redacted_fields(step.tool))
    reason = redact_text(outage.reason(down.error), secrets)[:2000]
    with transaction.atomic():
        if operations.holds_key(state.run, step.tool):
            # nothing reached the server: the key is free while it is down
            executions.settle(step.id, executions.RELEASED)
        if tool.commits_before_call:
            writer.undo_attempt(step, down.attempt)
        step.status, step.attempts, step.error = StepStatus.PENDING, down.attempt - 1, reason
        stage(state.pending.batch, step, ["status", "attempts", "error"])
        data = step_event_data(
            step, next_attempt_at=iso(until), waiting_on=down.error.server, reason=reason
        )
        journal.commit(state, [(EventType.STEP_RETRY_SCHEDULED, data)])
    return until, reason


async def _backed_off(state: SliceState, noted: Any, outage: ToolOutage) -> None:
    until, reason = noted
    wait = (until - timezone.now()).total_seconds()
    if state.drain is not None and wait > conf.RETRY_SLEEP_MAX_SECONDS:
        why = {"reason": reason, "tool_outage": outage.state()}
        raise await journal.ended(state, BackingOff(until, why))
    if not await journal.wait_for_retry(state, until):
        raise await journal.ended(state, Cancelled())


class _Unreachable(ServerUnavailable):
    def __init__(self, error: ServerUnavailable, attempt: int, started: Any) -> None:
        super().__init__(str(error), server=error.server, retry_after=error.retry_after)
        self.error, self.attempt, self.started = error, attempt, started


_RETRY = object()  # the attempt failed and its policy tries again


async def _attempt(state: SliceState, step: Step, tool: Tool, body: Any) -> Any:
    """The call's attempts under its retry policy (its outcome, or the slice's end). A
    transactional tool's attempt holds one lane thread: its writes, and the commit of its
    result, are one transaction on that thread's connection."""
    while True:
        if tool.transactional:
            async with state.lane.held():
                outcome = await _try(state, step, tool, body)
        else:
            outcome = await _try(state, step, tool, body)
        if outcome is not _RETRY:
            return outcome
        if step.next_attempt_at:
            await _wait_for_retry(state, step)


async def _try(state: SliceState, step: Step, tool: Tool, body: Any) -> Any:
    lane = state.lane
    attempt, started = step.attempts + 1, timezone.now()
    # a call without a gate or a "before" commit opens without the database, and one without a
    # side effect records its result into the pending batch: neither needs the lane
    quiet = not (tool.commits_before_call or operations.gated(state.run, tool))
    if quiet:
        opened = _open(state, step, tool, attempt, started)
    else:
        while (opened := await lane.run(_open, state, step, tool, attempt, started)) is _AGAIN:
            pass
    if opened is not _GO:
        return opened  # answered without a call: refused, or the key's earlier execution
    # a transactional call right after its model turn runs in the transaction that records
    # that turn; if it fails there, all of it rolls back and the turn is recorded without it
    eager = tool.transactional and bool(state.pending)
    atomic = await lane.run(_enter_atomic) if tool.transactional else None
    # the decision that let an approved call run: the tool may pass on the approver's words
    approval = await lane.run(inbox().approval_of, step) if step.approved else None
    run = state.run
    tctx = ToolContext(
        run=run,
        step=step,
        attempt=attempt,
        idempotency_key=step.idempotency_key,
        approval=approval,
    )
    secrets = secret_values(step.arguments, run.redacted_fields(step.tool))
    failure: BaseException | None = None
    failure_tb = ""
    payload: Any = None
    try:
        with (
            tracing.tool_span(run, step, tctx) as traced,
            secrets_in_scope(secrets),
            stepping(tctx),
        ):
            payload = await body()
            if traced is not None:
                traced.result(payload.get("result") if isinstance(payload, dict) else payload)
    except BaseException as exc:
        if not isinstance(exc, Exception) or is_infrastructure_error(exc):
            if atomic is not None:
                await lane.run(atomic.__exit__, type(exc), exc, exc.__traceback__)
            if isinstance(exc, SliceEnds) and exc.after is not None:  # ended inside the call
                raise SliceEnds(await lane.run(journal.end, state, exc.after)) from None
            raise  # weather, a lost lease or the slice ending: not the tool's verdict
        failure, failure_tb = exc, traceback.format_exc()
    if failure is None:
        if quiet and not tool.side_effect and atomic is None:
            return _returned_now(state, step, tool, attempt, started, payload, None)
        return await lane.run(_returned_now, state, step, tool, attempt, started, payload, atomic)
    return await lane.run(
        _failed_now, state, step, tool, attempt, started, failure, failure_tb, atomic, eager
    )


def _enter_atomic() -> Any:
    atomic = transaction.atomic()
    atomic.__enter__()
    return atomic


def _returned_now(
    state: SliceState,
    step: Step,
    tool: Tool,
    attempt: int,
    started: Any,
    payload: Any,
    atomic: Any,
) -> Any:
    """On the lane: the call returned; its record (in its transaction when it has one)."""
    failpoints.hit("tool_returned", tool=step.tool, step_id=step.id)
    try:
        outcome = _returned(
            state, step, tool, attempt, started, payload, end_transaction=atomic is not None
        )
    except BaseException as exc:
        if atomic is not None:
            atomic.__exit__(type(exc), exc, exc.__traceback__)
        raise
    if atomic is not None:
        atomic.__exit__(None, None, None)
    if outcome is None:
        failpoints.hit("step_persisted", tool=step.tool, step_id=step.id)
    return payload


def _failed_now(
    state: SliceState,
    step: Step,
    tool: Tool,
    attempt: int,
    started: Any,
    failure: BaseException,
    failure_tb: str,
    atomic: Any,
    eager: bool,
) -> Any:
    """On the lane: the call raised. `_RETRY` when it is tried again (now, or when its policy's
    delay is due); an unreachable server or an unknown outcome raise."""
    if atomic is not None:  # its writes roll back; the failure is recorded on its own
        atomic.__exit__(type(failure), failure, failure.__traceback__)
    if eager and not isinstance(failure, ServerUnavailable | OutcomeUnknown):
        # (as the engine always did: that try is no attempt; the call runs again on its
        # own, with its retry policy, once the turn is recorded)
        journal.commit(state, [])
    elif isinstance(failure, ServerUnavailable):
        raise _Unreachable(failure, attempt, started)
    elif isinstance(failure, OutcomeUnknown) and tool.commits_before_call:
        # the call's connection broke after it was sent: reconciled, as after a dead worker
        secrets = secret_values(step.arguments, state.run.redacted_fields(step.tool))
        why = redact_text(str(failure), secrets)[:2000]
        raise SliceEnds(journal.end(state, Reconciled(step, why)))
    else:
        _failed(state, step, tool, attempt, started, failure, failure_tb)
    return _RETRY


def _result_of(payload: Any) -> Any:
    """The step's result (the JSON people and the API see) of a recorded CallToolResult."""
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if kind in ("tool_return", "tool_content_result"):
        return storable(json.loads(json.dumps(payload.get("result"), default=str)))
    if kind == "validation_error":
        errors = [
            {"loc": e.get("loc"), "msg": e.get("msg"), "type": e.get("type")}
            for e in payload.get("errors", [])
        ]
        return {"error": f"invalid arguments: {errors}", "retry": True}
    if kind in _FED_BACK:
        return {"error": payload.get("message", ""), "retry": _FED_BACK[kind]}
    return storable(payload)


def _returned(
    state: SliceState,
    step: Step,
    tool: Tool,
    attempt: int,
    started: Any,
    payload: Any,
    *,
    end_transaction: bool,
) -> str | None:
    """The call returned (a value, or control flow Pydantic AI carries as a value)."""
    kind = payload.get("kind") if isinstance(payload, dict) else None
    now = timezone.now()
    batch = state.pending.batch if not tool.commits_before_call else WriteBatch()
    if kind in ("approval_required", "call_deferred"):
        # the tool deferred itself (asks for approval, or its result comes from outside): its
        # attempt made no call; the wait for the decision or the result takes over
        if tool.commits_before_call:
            end_attempt(
                batch,
                step,
                attempt,
                finished_at=now,
                outcome=AttemptOutcome.FAILED,
                error="the tool asked for approval first"
                if kind == "approval_required"
                else "deferred: its result comes later",
            )
        step.status = StepStatus.PENDING
        stage(batch, step, ["status"])
        keyed = operations.holds_key(state.run, step.tool)
        with transaction.atomic() if keyed else nullcontext():
            if keyed:  # nothing was made, and a parked call holds no key
                executions.settle(step.id, executions.RELEASED)
            if batch is not state.pending.batch:
                journal.commit(state, [], batch=batch, end_transaction=end_transaction)
        return "deferred"
    if not tool.commits_before_call:
        step.started_at = started
        batch.insert(
            [
                attempt_row(
                    step,
                    attempt,
                    state.owner,
                    started,
                    finished_at=now,
                    outcome=AttemptOutcome.SUCCEEDED,
                )
            ]
        )
    else:
        end_attempt(batch, step, attempt, finished_at=now, outcome=AttemptOutcome.SUCCEEDED)
    step.status, step.result, step.error = StepStatus.SUCCEEDED, _result_of(payload), ""
    step.payload = journal_text(payload)
    step.attempts, step.finished_at, step.next_attempt_at = attempt, now, None
    stage(batch, step, TOOL_RESULT_FIELDS)
    event = (EventType.STEP_SUCCEEDED, succeeded_event_data(state.run, step))
    if tool.side_effect or batch is not state.pending.batch:
        # a side effect's "after" commit; a transactional tool's, in the call's transaction;
        # the key the call holds is done with its result in the same commit (or both are lost)
        keyed = operations.holds_key(state.run, step.tool)
        with transaction.atomic() if keyed and not end_transaction else nullcontext():
            if keyed:
                executions.settle(step.id, executions.DONE, step.result)
            journal.commit(
                state,
                [event],
                batch=None if batch is state.pending.batch else batch,
                end_transaction=end_transaction or keyed,
            )
    else:
        state.pending.events.append(event)
    record_durable_unit(executed=True)
    return None


def _failed(
    state: SliceState,
    step: Step,
    tool: Tool,
    attempt: int,
    started: Any,
    exc: BaseException,
    tb: str = "",
) -> None:
    """The tool failed: retried under its policy (returns: the caller waits for the retry's
    delay, then calls again), or the step and the run fail (raises the slice's end)."""
    now = timezone.now()
    retry = tool.retry.is_retryable(exc) and attempt - step.retry_base < tool.retry.max_attempts
    outcome = AttemptOutcome.RETRYING if retry else AttemptOutcome.FAILED
    # people read these (pages, admin, events): the step's secret values and anything that
    # looks like a credential are masked before they are written
    secrets = secret_values([step.arguments, step.result], state.run.redacted_fields(step.tool))
    fields = {
        "finished_at": now,
        "outcome": outcome,
        "error": redact_text(str(exc), secrets)[:2000],
        "traceback": redact_text(tb or traceback.format_exc(), secrets)[-8000:],
    }
    batch = WriteBatch()
    if tool.commits_before_call:
        end_attempt(batch, step, attempt, **fields)
    else:
        batch.insert([attempt_row(step, attempt, state.owner, started, **fields)])
    step.attempts = attempt
    step.error = redact_text(f"{type(exc).__name__}: {exc}", secrets)
    step.started_at = step.started_at or started
    changed = ["status", "error", "attempts", "started_at", "finished_at", "next_attempt_at"]
    if retry:
        delay = tool.retry.delay_for(attempt)
        step.status, step.next_attempt_at = StepStatus.PENDING, now + timedelta(seconds=delay)
        stage(batch, step, changed)
        data = step_event_data(step, next_attempt_at=iso(step.next_attempt_at))
        journal.commit(state, [(EventType.STEP_RETRY_SCHEDULED, data)], batch=batch)
        return
    step.status, step.finished_at, step.next_attempt_at = StepStatus.FAILED, now, None
    stage(batch, step, changed)
    keyed = operations.holds_key(state.run, step.tool)
    with transaction.atomic() if keyed else nullcontext():
        if keyed:
            executions.settle(step.id, executions.RELEASED)  # failed for good: free again
        journal.commit(state, [(EventType.STEP_FAILED, step_event_data(step))], batch=batch)
    raise SliceEnds(
        journal.end(state, Failed(f"step #{step.index} {step.tool} failed: {step.error}"))
    )
