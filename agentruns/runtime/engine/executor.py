"""The durable executor (DESIGN.md section 4): one slice of a run, running the agent's own loop.

`RunExecutor(run_id).advance()` is the body of the `advance_run` task (and of a pool thread's
turn at a run). It claims the run's lease with one conditional UPDATE, loads the run and its
journal, and runs the agent's own Pydantic AI loop (`agent.run`) inside our durability
capability (`durability.py`) on this thread's event loop (`loop.py`): every durable unit of the
loop reaches `backend.py`, which replays what the journal holds and executes the rest, each
commit fenced on the lease (`commit`), renewing it, allocating the event seqs and reading the
cancel flag in one statement. A slice ends when the agent's loop returns (the run finishes),
or when a unit raises `SliceEnds` (parked, yielded, backing off, a stop condition, a cancel):
the slice's last commit is then made here (`status.py` has them).

An infrastructure error (`outages/faults.py`) anywhere in the slice is weather, not a verdict:
the slice stops without writing, no attempt is counted, and the process's lease keeper releases
the lease and rings the run once the database answers. Only the engine's own errors end the run
as "internal error".
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from contextlib import nullcontext
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from pydantic_ai.exceptions import AgentRunError, UserError

from agentruns.conf import conf
from agentruns.models import JournalEntry, Run, RunStatus, Step, Wait
from agentruns.registry import UnknownAgent, get_agent
from agentruns.runtime import tracing, writer
from agentruns.runtime.dispatch import lease, thread_line
from agentruns.runtime.dispatch.lease import Heartbeat
from agentruns.runtime.engine import status
from agentruns.runtime.engine.lanes import CallerLane, Lane, run_on_process_loop
from agentruns.runtime.engine.loop import run_agent
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import EventSpec, LeaseLost
from agentruns.runtime.execution import transitions
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.providers import ModelError
from agentruns.runtime.store import get_store
from agentruns.runtime.store.rows import WriteBatch
from agentruns.runtime.values.ids import worker_id

log = logging.getLogger(__name__)


def _merged(first: dict[str, Any], second: dict[str, Any] | None) -> dict[str, Any]:
    """Two sets of run increments as one (a cost is a Decimal, counts are ints)."""
    out = dict(first)
    for name, value in (second or {}).items():
        out[name] = out[name] + value if name in out else value
    return out


def _reads_nothing(claimed: Run | None) -> bool:
    """A run the claim returned brand new (no history, no error, its agent deployed): loading
    it needs no query."""
    if claimed is None or claimed.error or claimed.step_count or claimed.last_seq > 2:
        return False
    try:
        get_agent(claimed.agent)
    except UnknownAgent:
        return False
    return True


class RunExecutor:
    def __init__(
        self,
        run_id: uuid.UUID | str,
        owner: str | None = None,
        *,
        drain: threading.Event | None = None,
    ) -> None:
        self.run_id = uuid.UUID(str(run_id))
        self.owner = owner or worker_id()
        self.ttl = conf.LEASE_TTL_SECONDS
        self.store = get_store()
        self.cancel_requested = False
        self.heartbeat: Heartbeat | None = None
        # set by the pool this executor runs in (None: executed in-process, nobody drains it)
        self.drain = drain
        self.trace_slice: Any = None  # tracing.begin_slice: the slice span, None when off
        self.state: SliceState | None = None
        self.run_key: tuple[str, str | None] | None = None  # (agent, concurrency key) once read
        self.thread_id: str | None = None  # the run's thread (models/threads.py), once read
        self.lane: Lane | None = None  # where the slice's blocking work runs (lanes.py)

    # ---------------------------------------------------------------- lease
    def claim(self) -> bool:
        now = timezone.now()
        held = {"lease_owner": self.owner, "lease_expires_at": now + timedelta(seconds=self.ttl)}
        return writer.claim(
            self.run_id, self.owner, transitions.started().events, lease=held, now=now
        )

    def commit(
        self,
        events: list[EventSpec],
        *,
        batch: WriteBatch | None = None,
        end_transaction: bool = False,
        set_fields: dict[str, Any] | None = None,
        incr_fields: dict[str, Any] | None = None,
    ) -> int:
        """The fenced run UPDATE + events, with the writes in `batch` and everything the slice
        has done but not committed yet (its pending batch, first), as one transaction.

        It renews the lease (unless `set_fields` releases it), allocates the seqs and reads the
        cancel flag, or raises LeaseLost (rolling the transaction back) when the lease is no
        longer ours. `end_transaction`: the caller's atomic block ends right after this."""
        now = timezone.now()
        fields = dict(set_fields or {})
        incr = dict(incr_fields or {})
        journal: list[Any] = []
        if self.state is not None and self.state.pending:
            pending = self.state.pending.take()
            journal = pending.journal
            if batch is not None:  # (a row both stage is inserted once: the pending one)
                ids = {id(row) for row in pending.batch.inserts}
                pending.batch.insert([row for row in batch.inserts if id(row) not in ids])
                pending.batch.updates.extend(batch.updates)
            batch = pending.batch
            events = [*pending.events, *events]
            fields = {**pending.set_fields, **fields}
            incr = _merged(pending.incr_fields, incr)
        if "lease_owner" not in fields:
            fields["lease_expires_at"] = now + timedelta(seconds=self.ttl)
        # an end lets the run's concurrency key and its thread's turn go in the same transaction
        # (nothing without them)
        with (
            transaction.atomic(savepoint=False) if journal else nullcontext(),
            thread_line.following(self.run_id, fields.get("status"), self.run_key, self.thread_id),
        ):
            if journal:
                writer.save_journal(journal)
            last_seq, self.cancel_requested = writer.commit(
                self.run_id,
                self.owner,
                events,
                now=now,
                set_fields=fields,
                incr_fields=incr or None,
                batch=batch,
                end_transaction=end_transaction and not journal,
            )
        if self.heartbeat is not None:
            self.heartbeat.renewed()
        return last_seq

    def check_lease(self) -> None:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(str(self.run_id))

    # ---------------------------------------------------------------- the slice
    def advance(self, claimed: Run | None = None) -> str:
        """Execute the run in the calling thread (`execute_inline`, scripts, tests): its agent
        loop as a task of the process's loop, its blocking work on this thread (its
        connection, its transaction), until it finishes, parks, yields or loses its lease.
        `claimed`: the run as created already leased by `self.owner`; otherwise claim it."""
        lane = CallerLane()
        done = run_on_process_loop(self.advance_in(lane, claimed))
        lane.serve(done)
        return done.result()

    @tracing.sliced
    async def advance_in(self, lane: Lane, claimed: Run | None = None) -> str:
        """The slice as a task of an event loop, its blocking work on `lane` (a worker's pool,
        `advance`)."""
        self.lane = lane
        try:
            if claimed is None and not await lane.run(self.claim):
                return "busy"
        except Exception as exc:
            if is_infrastructure_error(exc):
                return await lane.run(self.weathered, exc)  # nothing claimed: only rung
            raise
        self.heartbeat = Heartbeat(self.run_id, self.owner, self.ttl)
        self.heartbeat.start()
        try:
            return await self._drive(claimed)
        except LeaseLost:
            log.warning("run %s: lease lost, another worker continues", self.run_id)
            return "lease_lost"
        except Exception as exc:
            if is_infrastructure_error(exc):
                return await lane.run(self.weathered, exc)
            # an engine bug must not leave a run stuck
            log.exception("run %s: engine error", self.run_id)
            return await lane.run(self._failed_internally, exc)
        finally:
            self.heartbeat.stop()

    def _failed_internally(self, exc: BaseException) -> str:
        close_old_connections()
        try:
            return status.finish(self, RunStatus.FAILED, error=f"internal error: {exc!r}")
        except LeaseLost:
            return "lease_lost"
        except Exception as second:
            if is_infrastructure_error(second):
                return self.weathered(second)
            raise

    def weathered(self, exc: BaseException) -> str:
        """The database (or Redis) failed under this slice: write nothing, count nothing; the
        process's lease keeper releases the lease (if this executor holds it) and rings the run
        when the database answers again, or the lease lapses and the sweeper does."""
        weather.outage_of(exc).noticed(exc, f"run {self.run_id}")
        log.info("run %s: slice stopped by an outage: %r", self.run_id, exc)
        try:
            connection.close()  # a connection that saw the error: back to the pool or closed
        except Exception:
            pass
        lease.hand_back(self.run_id, self.owner)
        return "weather"

    def _load(self, claimed: Run | None) -> tuple[Run, Any, list[Step], list, list] | str:
        """The run, its agent and its journal (a brand-new run has none), or the slice's end
        when its agent is not deployed here."""
        run = claimed if claimed is not None else self.store.load_run(self.run_id)
        self.run_key = (run.agent, run.concurrency_key)
        self.thread_id = run.thread_id
        try:
            agent = get_agent(run.agent)
        except UnknownAgent as exc:  # a deploy without its module: wait for it, no verdict
            return status.back_off(
                self,
                timezone.now() + timedelta(seconds=conf.AGENT_MISSING_RETRY_SECONDS),
                waiting=f"{exc}: not deployed in this worker, the run waits for it",
            )
        if run.error:  # what it waited for (its agent) is back
            Run.objects.filter(id=self.run_id, status=RunStatus.RUNNING).update(error="")
        # a brand-new run (no steps counted, only its created + running events) has no history
        if run.step_count == 0 and run.last_seq <= 2:
            return run, agent, [], [], []
        return (
            run,
            agent,
            list(Step.objects.filter(run_id=self.run_id).order_by("index")),
            list(JournalEntry.objects.filter(run_id=self.run_id)),
            list(Wait.objects.filter(run_id=self.run_id)),
        )

    async def _drive(self, claimed: Run | None) -> str:
        lane = self.lane
        loaded = (
            self._load(claimed) if _reads_nothing(claimed) else await lane.run(self._load, claimed)
        )
        if isinstance(loaded, str):
            return loaded
        run, agent, steps, entries, waits = loaded
        self.trace_slice = tracing.begin_slice(self, run)
        self.cancel_requested = run.cancel_requested
        self.state = state = SliceState(
            run=run,
            agent=agent,
            steps=steps,
            ends_at=time.monotonic() + conf.SLICE_SECONDS,
            drain=self.drain,
            executor=self,
            lane=lane,
        )
        if steps or entries or waits:
            state.index_steps()
            state.entries, state.waits = entries, waits
        if self.cancel_requested:  # cancelled before this slice began: at its first boundary
            return await lane.run(status.cancel_at_boundary, self)
        try:
            result = await run_agent(state)
        except SliceEnds as ends:
            return await lane.run(ends.commit) if ends.commit is not None else ends.outcome
        except ModelError as exc:  # the run's model cannot be built (an SDK, a key missing)
            return await lane.run(
                status.finish, self, RunStatus.FAILED, error=f"model error: {exc}"
            )
        except (AgentRunError, UserError) as exc:  # the agent's own loop gave up: its reason
            error = f"{type(exc).__name__}: {exc}"
            return await lane.run(status.finish, self, RunStatus.FAILED, error=error)
        return await lane.run(status.finished_with, self, result)

    # ---------------------------------------------------------------- stop conditions
    def stop_condition(self) -> tuple[str, str] | None:
        """Before a new model request: max steps, the token budget, the cost budget."""
        state = self.state
        assert state is not None
        run = state.run
        if len(state.steps) >= run.max_steps:
            return (
                "max_steps",
                f"stopped after {len(state.steps)} steps (max_steps={run.max_steps})",
            )
        budget = run.token_budget
        if budget and run.total_tokens >= budget:
            return "token_budget", f"token budget exhausted ({run.total_tokens} of {budget})"
        limit = getattr(state.agent, "max_cost_usd", None)
        max_cost = Decimal(str(limit if limit is not None else conf.MAX_COST_USD or 0))
        if max_cost and run.cost_usd >= max_cost:
            return "cost_budget", f"cost budget exhausted (${run.cost_usd} of ${max_cost})"
        return None
