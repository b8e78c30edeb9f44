"""Many streaming runs in ONE worker process, their deltas written together (issue 22 item 4).

Real parts: daphne on PostgreSQL, a real `qcluster` with one worker process carrying every run,
the scripted refund model streaming a token every 20 ms, `websockets` clients watching every run
at once. The process's delta writer commits the text of all its runs in one statement per tick;
the stream's promises (DESIGN.md 5) must hold for every run all the same:

- each viewer's frames are the run's event log exactly (seq 1..last, nothing twice, same data),
  including viewers that hang up half way and resume from that mid cursor;
- the deltas of different runs really went out in shared commits (same commit time in the log);
- a SIGKILL of the worker mid-stream leaves no hole: every run's seqs stay contiguous, every
  attempt the crash cut is superseded and the text it had streamed is an unbroken prefix of the
  turn's text (the lost part is only the end: the last tick), and no refund happens twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

from agentruns.models import Run, RunEvent, Step
from agentruns.runtime.events import event_payload
from agentruns.tokens import create_token
from tests.helpers import assert_gapless
from tests.procs import (
    gateway_refunds,
    module_web,
    start_run_over_http,
    start_web,
    start_worker,
    wait_until,
)

from .kit import expected_text, text_from_frames

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.timeout(600)]
TERMINAL = {"succeeded", "failed", "cancelled"}
RUNS = 16
ORDERS = [f"ORD-{1001 + n}" for n in range(RUNS)]


class Viewer(threading.Thread):
    """Watches one run over the socket until it ends; `resume_at_half`: hangs up once half the
    run's text is in and carries on from its last seq (a mid cursor) on a new connection."""

    def __init__(self, base_url: str, run_id: str, token: str, resume_at_half: bool) -> None:
        super().__init__(daemon=True)
        self.ws_url = base_url.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
        self.origin, self.token = base_url, token
        self.resume_at_half = resume_at_half
        self.frames: list[dict] = []
        self.connections = 0
        self.resumed_from: int | None = None
        self.error: BaseException | None = None

    @property
    def finished(self) -> bool:
        return any(
            f["type"] == "run.status" and f["data"]["status"] in TERMINAL for f in self.frames
        )

    def run(self) -> None:
        deadline = time.monotonic() + 300
        try:
            while not self.finished and time.monotonic() < deadline:
                self._connection()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _connection(self) -> None:
        after = self.frames[-1]["seq"] if self.frames else 0
        try:
            with connect(
                f"{self.ws_url}?after={after}",
                origin=self.origin,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=30,
                close_timeout=1,
            ) as ws:
                self.connections += 1
                if self.connections == 2:
                    self.resumed_from = after
                while not self.finished:
                    self.frames.append(json.loads(ws.recv(timeout=60)))
                    deltas = sum(1 for f in self.frames if f["type"] == "model.delta")
                    if self.resume_at_half and self.connections == 1 and deltas >= 6:
                        return  # hang up mid-stream; the next connection resumes from here
        except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError):
            time.sleep(0.2)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    """The refund gateway, a daphne of its own shared by the module's tests (its ledger is the
    database's: each test sees only its own refunds)."""
    with module_web(tmp_path_factory, django_db_blocker) as url:
        yield url


def environment(gateway: str) -> tuple[dict[str, str], list]:
    env = {
        "SCRIPTED_MODEL_DELAY_MS": "20",
        "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000",
        "REFUND_GATEWAY_URL": f"{gateway}/gateway",
        "Q_WORKERS": "1",  # one worker process carries every run
        "AGENTRUNS_STREAM_POLL_SECONDS": "0.1",
    }
    return env, []


def start_runs(base_url: str, token: str) -> list[str]:
    return [
        start_run_over_http(base_url, token, {"order_id": order, "message": "It broke."})
        for order in ORDERS
    ]


def wait_succeeded(run_ids: list[str], *procs) -> list[Run]:
    def all_done() -> bool:
        return Run.objects.filter(id__in=run_ids, status="succeeded").count() == len(run_ids)

    try:
        wait_until(all_done, timeout=240, message="every run succeeded")
    except TimeoutError:
        raise AssertionError("\n".join(p.log() for p in procs)) from None
    return list(Run.objects.filter(id__in=run_ids))


def assert_frames_are_the_log(viewer: Viewer, run: Run) -> None:
    assert viewer.error is None, viewer.error
    seqs = [f["seq"] for f in viewer.frames]
    assert seqs == list(range(1, run.last_seq + 1)), "seq 1..last: no gap, no duplicate"
    db_events = [event_payload(e) for e in RunEvent.objects.filter(run=run).order_by("seq")]
    assert [{k: v for k, v in f.items() if k != "html"} for f in viewer.frames] == db_events
    model_text = "".join(
        Step.objects.filter(run=run, kind="model").order_by("index").values_list("text", flat=True)
    )
    assert text_from_frames(viewer.frames) == expected_text(run.id) == model_text


def test_many_streaming_runs_in_one_process_share_their_delta_commits(
    tmp_path, lead, seeded, gateway
):
    env, procs = environment(gateway)
    token = create_token(lead)
    try:
        web, base_url = start_web(tmp_path, **env)
        procs.append(web)
        procs.append(start_worker(tmp_path, **env))
        run_ids = start_runs(base_url, token)
        viewers = [
            Viewer(base_url, rid, token, resume_at_half=n % 2 == 0) for n, rid in enumerate(run_ids)
        ]
        for viewer in viewers:
            viewer.start()
        runs = {str(r.id): r for r in wait_succeeded(run_ids, *procs)}
        for viewer in viewers:
            viewer.join(timeout=120)
    finally:
        for proc in procs:
            proc.stop()

    resumed = 0
    for run_id, viewer in zip(run_ids, viewers, strict=True):
        assert_frames_are_the_log(viewer, runs[run_id])
        if viewer.resume_at_half:
            assert viewer.connections >= 2 and viewer.resumed_from, "resumed from a mid cursor"
            resumed += 1
    assert resumed == RUNS // 2

    # one statement wrote the deltas of several runs: they share its commit time
    runs_per_commit: dict = defaultdict(set)
    for run_id, created in RunEvent.objects.filter(
        run_id__in=run_ids, type="model.delta"
    ).values_list("run_id", "created_at"):
        runs_per_commit[created].add(run_id)
    shared = [at for at, ids in runs_per_commit.items() if len(ids) > 1]
    assert shared, "no flush carried the deltas of more than one run"
    deltas = RunEvent.objects.filter(run_id__in=run_ids, type="model.delta").count()
    print(
        f"{deltas} delta events of {RUNS} runs in {len(runs_per_commit)} commits; "
        f"{len(shared)} carried several runs (up to {max(len(v) for v in runs_per_commit.values())})"
    )


def test_sigkill_mid_stream_leaves_no_hole_and_no_second_refund(tmp_path, lead, seeded, gateway):
    env, procs = environment(gateway)
    token = create_token(lead)
    gateway_url = gateway
    try:
        web, base_url = start_web(tmp_path, **env)
        procs.append(web)
        first = start_worker(tmp_path, name="first", **env)
        procs.append(first)
        run_ids = start_runs(base_url, token)

        def running_attempts() -> set[tuple]:
            return set(
                Step.objects.filter(run_id__in=run_ids, kind="model", status="running").values_list(
                    "run_id", "index", "attempts"
                )
            )

        def streaming_now() -> int:
            """Runs whose model attempt is running with deltas written beyond its first flush."""
            live = running_attempts()
            written: Counter = Counter(
                (run_id, data["step"], data["attempt"])
                for run_id, data in RunEvent.objects.filter(
                    run_id__in={r for r, _, _ in live}, type="model.delta"
                ).values_list("run_id", "data")
            )
            return sum(1 for attempt in live if written[attempt] >= 3)

        wait_until(lambda: streaming_now() >= RUNS // 2, timeout=120, message="runs mid-stream")
        first.kill()  # SIGKILL: no flush, no cleanup
        # a statement the dead worker sent just before the kill may still commit on the server:
        # the attempts it cut are those still running once two reads 0.5 s apart agree
        cut, previous = running_attempts(), None
        while cut != previous:
            time.sleep(0.5)
            previous, cut = cut, running_attempts()
        assert len(cut) >= 2, "the kill cut several runs mid-stream"
        procs.append(start_worker(tmp_path, name="second", **env))
        runs = wait_succeeded(run_ids, *procs)
        refunds = {order: gateway_refunds(gateway_url, order) for order in ORDERS}
    finally:
        for proc in procs:
            proc.stop()

    assert all(len(done) == 1 for done in refunds.values()), refunds  # one refund per run
    superseded: set[tuple] = set()
    for run in runs:
        assert_gapless(run)
        events = list(RunEvent.objects.filter(run=run).order_by("seq"))
        steps = {s.index: s for s in Step.objects.filter(run=run, kind="model")}
        text: dict[tuple[int, int], str] = defaultdict(str)
        for event in events:
            if event.type == "model.delta":
                text[(event.data["step"], event.data["attempt"])] += event.data["text"]
        for event in events:
            if event.type != "model.superseded":
                continue
            key = (event.data["step"], event.data["attempt"])
            superseded.add((run.id, *key))
            # the scripted model says the same again: what the cut attempt streamed is the
            # turn's text with only its end missing (never a piece from the middle)
            assert steps[key[0]].text.startswith(text[key]), (run.id, key)
        frames = [event_payload(e) for e in events]
        model_text = "".join(s.text for _, s in sorted(steps.items()))
        assert text_from_frames(frames) == expected_text(run.id) == model_text
        assert model_text.endswith(run.output) and run.output
    # every attempt the kill cut was superseded (and none that it did not cut)
    assert superseded == cut
