"""The durable executor (DESIGN.md section 4): it claims a run and drives one slice of it.

`RunExecutor(run_id).advance()` executes a slice in the calling thread (`execute_inline`,
scripts, tests); a worker's pool awaits `advance_in(lane)` as a task of its process's loop. The
executor claims the run's lease with one conditional UPDATE, loads the run and its journal, and
runs the agent's own Pydantic AI loop (`loop.py`) inside our durability capability: every
durable unit of the loop reaches `backend.py`, which replays what the journal holds and executes
the rest, each unit handing what it did to the journal (`journal.py`: the fenced commits and
the slice's end). A slice ends when the agent's loop returns (`journal.Finished`) or a unit
ended it (`SliceEnds`, its last commit already made).

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
from datetime import timedelta

from django.db import close_old_connections, connection
from django.utils import timezone
from pydantic_ai.exceptions import AgentRunError, UserError

from agentruns.conf import conf
from agentruns.models import JournalEntry, ResumePoint, Run, RunStatus, Step, Wait
from agentruns.registry import UnknownAgent, get_agent
from agentruns.runtime import tracing, writer
from agentruns.runtime.dispatch import lease
from agentruns.runtime.dispatch.lease import Heartbeat
from agentruns.runtime.engine import journal, resume
from agentruns.runtime.engine.journal import BackingOff, Cancelled, Failed, Finished
from agentruns.runtime.engine.lanes import CallerLane, Lane, run_on_process_loop
from agentruns.runtime.engine.loop import run_agent
from agentruns.runtime.engine.slice import SliceEnds, SliceState
from agentruns.runtime.events import LeaseLost
from agentruns.runtime.execution import transitions
from agentruns.runtime.outages import weather
from agentruns.runtime.outages.faults import is_infrastructure_error
from agentruns.runtime.providers import ModelError
from agentruns.runtime.store import get_store
from agentruns.runtime.values.ids import worker_id

log = logging.getLogger(__name__)


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
        self.store = get_store()
        # set by the pool this executor runs in (None: executed in-process, nobody drains it)
        self.drain = drain
        self.state: SliceState | None = None  # the slice, once claimed

    def claim(self) -> bool:
        now = timezone.now()
        expires = now + timedelta(seconds=conf.LEASE_TTL_SECONDS)
        held = {"lease_owner": self.owner, "lease_expires_at": expires}
        return writer.claim(
            self.run_id, self.owner, transitions.started().events, lease=held, now=now
        )

    @property
    def heartbeat(self) -> Heartbeat | None:
        """The lease keeper's entry of the slice in progress (the pool's drain flags it)."""
        return self.state.heartbeat if self.state is not None else None

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
        try:
            if claimed is None and not await lane.run(self.claim):
                return "busy"
        except Exception as exc:
            if is_infrastructure_error(exc):
                return await lane.run(self.weathered, exc)  # nothing claimed: only rung
            raise
        self.state = state = SliceState(
            run_id=self.run_id,
            owner=self.owner,
            ttl=conf.LEASE_TTL_SECONDS,
            lane=lane,
            drain=self.drain,
            heartbeat=Heartbeat(self.run_id, self.owner, conf.LEASE_TTL_SECONDS),
        )
        state.heartbeat.start()
        try:
            return await self._drive(state, claimed)
        except SliceEnds as ends:  # (an end made before the agent's loop began)
            return ends.outcome
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
            state.heartbeat.stop()

    def _failed_internally(self, exc: BaseException) -> str:
        close_old_connections()
        try:
            return journal.end(self.state, Failed(f"internal error: {exc!r}"))
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

    def _load(self, state: SliceState, claimed: Run | None) -> None:
        """The run, its agent and its journal into `state` (a brand-new run has none); its end
        (raised) when its agent is not deployed here."""
        run = claimed if claimed is not None else self.store.load_run(self.run_id)
        state.run_key, state.thread_id = (run.agent, run.concurrency_key), run.thread_id
        try:
            state.agent = get_agent(run.agent)
        except UnknownAgent as exc:  # a deploy without its module: wait for it, no verdict
            until = timezone.now() + timedelta(seconds=conf.AGENT_MISSING_RETRY_SECONDS)
            why = {"waiting": f"{exc}: not deployed in this worker, the run waits for it"}
            raise SliceEnds(journal.end(state, BackingOff(until, why))) from None
        if run.error:  # what it waited for (its agent) is back
            Run.objects.filter(id=self.run_id, status=RunStatus.RUNNING).update(error="")
        state.run = run
        # a brand-new run (no steps counted, only its created + running events) has no history
        if run.step_count == 0 and run.last_seq <= 2:
            return
        state.steps = list(Step.objects.filter(run_id=self.run_id).order_by("index"))
        state.entries = list(JournalEntry.objects.filter(run_id=self.run_id))
        state.waits = list(Wait.objects.filter(run_id=self.run_id))
        state.index_steps()
        resume.load(state, ResumePoint.objects.filter(run_id=self.run_id).first())

    async def _drive(self, state: SliceState, claimed: Run | None) -> str:
        lane = state.lane
        if _reads_nothing(claimed):
            self._load(state, claimed)
        else:
            await lane.run(self._load, state, claimed)
        run = state.run
        state.trace_slice = tracing.begin_slice(state, run)
        state.cancel_requested = run.cancel_requested
        if conf.SLICE_SECONDS:
            state.ends_at = time.monotonic() + conf.SLICE_SECONDS
        if state.cancel_requested:  # cancelled before this slice began: at its first boundary
            return await lane.run(journal.end, state, Cancelled())
        try:
            result = await run_agent(state)
        except SliceEnds as ends:
            if ends.after is not None:  # (an end raised from a call outside a tool's unit)
                return await lane.run(journal.end, state, ends.after)
            return ends.outcome
        except ModelError as exc:  # the run's model cannot be built (an SDK, a key missing)
            return await lane.run(journal.end, state, Failed(f"model error: {exc}"))
        except (AgentRunError, UserError) as exc:  # the agent's own loop gave up: its reason
            return await lane.run(journal.end, state, Failed(f"{type(exc).__name__}: {exc}"))
        return await lane.run(journal.end, state, Finished(result))
