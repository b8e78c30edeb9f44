"""The stream end to end: daphne on PostgreSQL, a real worker, the `websockets` client.

A viewer reads part of a streaming refund run, drops the connection at a random moment,
reconnects with `after=<last seq>`, again and again; once, the web server process is killed and
started again on the same port mid-run. The frames collected over all those connections must be
the run's event log exactly (seq 1..last, no gap, no duplicate, same types and data), and the
text they spell must be the model text the database holds. Once with the in-memory channel layer
and the database poll, once with channels_redis against a real redis-server.

The refund gateway runs as its own daphne process (REFUND_GATEWAY_URL), so restarting the web
process tests the stream, not the refund tool's retry budget.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

from agentruns.models import Run, RunEvent, Step
from agentruns.runtime.events import event_payload
from agentruns.tokens import create_token
from tests.procs import (
    free_port,
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


class ResumingViewer:
    """A stream client that hangs up at random moments and resumes with after=<last seq>."""

    def __init__(self, base_url: str, run_id: str, token: str, rng: random.Random) -> None:
        self.ws_url = base_url.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
        self.origin = base_url
        self.token, self.rng = token, rng
        self.frames: list[dict] = []
        self.connections = 0
        self.failed_connects = 0  # connections refused or cut by the server
        self.on_frame: Callable[[ResumingViewer], None] = lambda viewer: None

    @property
    def last_seq(self) -> int:
        return self.frames[-1]["seq"] if self.frames else 0

    @property
    def finished(self) -> bool:
        return any(
            f["type"] == "run.status" and f["data"]["status"] in TERMINAL for f in self.frames
        )

    @property
    def delta_count(self) -> int:
        return sum(1 for f in self.frames if f["type"] == "model.delta")

    def one_connection(self) -> None:
        """Connect, read for a random number of frames or a random time, hang up."""
        max_frames = self.rng.randint(1, 5)
        max_seconds = self.rng.uniform(0.02, 0.4)
        try:
            with connect(
                f"{self.ws_url}?after={self.last_seq}",
                origin=self.origin,
                additional_headers={"Authorization": f"Bearer {self.token}"},
                open_timeout=10,
                close_timeout=1,
            ) as ws:
                self.connections += 1
                ends = time.monotonic() + max_seconds
                for _ in range(max_frames):
                    remaining = ends - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        raw = ws.recv(timeout=remaining)
                    except TimeoutError:
                        break
                    self.frames.append(json.loads(raw))
                    self.on_frame(self)
                    if self.finished:
                        return
        except (OSError, InvalidHandshake, ConnectionClosed):
            # the server is down or restarting: back off a little and try again
            self.failed_connects += 1
            time.sleep(self.rng.uniform(0.05, 0.3))


def assert_stream_is_the_log(viewer: ResumingViewer, run: Run, base_url: str, token: str) -> None:
    seqs = [f["seq"] for f in viewer.frames]
    assert seqs == list(range(1, run.last_seq + 1)), (
        "frames must be seq 1..last: no gap, no duplicate"
    )
    db_events = [event_payload(e) for e in RunEvent.objects.filter(run=run).order_by("seq")]
    assert [{k: v for k, v in f.items() if k != "html"} for f in viewer.frames] == db_events
    assert all("html" in f for f in viewer.frames)
    api = httpx.get(
        f"{base_url}/api/runs/{run.id}/events?after=0", headers={"Authorization": f"Bearer {token}"}
    ).json()["events"]
    assert api == db_events
    model_text = "".join(
        Step.objects.filter(run=run, kind="model").order_by("index").values_list("text", flat=True)
    )
    assert text_from_frames(viewer.frames) == expected_text(run.id) == model_text
    assert model_text.endswith(run.output) and run.output


@pytest.fixture(scope="module")
def gateway(tmp_path_factory, django_db_setup, django_db_blocker) -> Iterator[str]:
    """The refund gateway, a daphne of its own for the module (its ledger is the database's:
    each test sees only its own refunds); slow, to keep a run in flight across a web restart."""
    with module_web(tmp_path_factory, django_db_blocker, REFUND_GATEWAY_DELAY_MS=1500) as url:
        yield url


def run_stream_scenario(
    tmp_path, lead, gateway_url: str, extra_env: dict[str, str], seed: int
) -> list[ResumingViewer]:
    rng = random.Random(seed)
    token = create_token(lead)
    web_port = free_port()
    env = {
        "SCRIPTED_MODEL_DELAY_MS": "20",
        "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000",
        "REFUND_GATEWAY_URL": f"{gateway_url}/gateway",
        **extra_env,
    }
    web, base_url = start_web(tmp_path, port=web_port, **env)
    webs = [web]  # every web process started, for cleanup
    restarts: list[float] = []
    worker = start_worker(tmp_path, **env)
    viewers = []

    def restart_web_mid_stream(viewer: ResumingViewer) -> None:
        """SIGKILL the web process while this viewer is connected; start it again meanwhile."""
        if viewer.delta_count < 3 or restarts:
            return
        restarts.append(time.monotonic())
        webs[0].kill()
        restart = threading.Thread(
            target=lambda: webs.append(start_web(tmp_path, port=web_port, **env)[0]), daemon=True
        )
        restart.start()

    try:
        for n, order in enumerate(["ORD-1003", "ORD-1004"]):
            run_id = start_run_over_http(
                base_url, token, {"order_id": order, "message": "It broke."}
            )
            viewer = ResumingViewer(base_url, run_id, token, rng)
            if n == 0:  # the first run sees the restart
                viewer.on_frame = restart_web_mid_stream
            deadline = time.monotonic() + 180
            while not viewer.finished:
                assert time.monotonic() < deadline, (
                    f"stream did not finish; web log:\n{webs[-1].log()}"
                )
                viewer.one_connection()
            if n == 0:
                assert restarts, "the web process was restarted mid-run"
                wait_until(lambda: len(webs) == 2, timeout=60, message="restarted web is up")
            run = wait_until(
                lambda run_id=run_id: Run.objects.filter(id=run_id, status="succeeded").first(),
                timeout=60,
                message="run row succeeded",
            )
            assert_stream_is_the_log(viewer, run, base_url, token)
            refunds = gateway_refunds(gateway_url, order)
            assert len(refunds) == 1  # the stream's restarts never touch the side effects
            assert viewer.connections >= 10, "the scenario must reconnect many times"
            print(
                f"run {n}: {viewer.connections} connections, {viewer.failed_connects} failed, {len(viewer.frames)} frames, {viewer.delta_count} deltas"
            )
            viewers.append(viewer)
    finally:
        worker.stop()
        for proc in webs:
            proc.stop()
    return viewers


def test_resume_across_random_disconnects_and_a_restart_with_memory_layer(
    tmp_path, lead, seeded, gateway
):
    env = {
        "AGENTRUNS_STREAM_POLL_SECONDS": "0.1",
        # the worker also dies once in every model step, mid-stream: the partial text of that
        # attempt is superseded and must not reach the concatenated text
        "AGENTRUNS_FAILPOINTS": "model_streaming:refund=crash_once",
        "AGENTRUNS_FAILPOINT_DIR": str(tmp_path / "failpoints"),
    }
    viewers = run_stream_scenario(tmp_path, lead, gateway, env, seed=4)
    assert viewers[0].failed_connects >= 1  # the restart was seen by the client
    for viewer in viewers:
        assert any(f["type"] == "model.superseded" for f in viewer.frames)


def test_resume_across_random_disconnects_and_a_restart_with_redis(
    tmp_path, lead, seeded, redis_server, gateway
):
    env = {
        "REDIS_URL": redis_server.url,
        # the safety-net poll is far slower than the stream: delivery rides on Redis nudges
        "AGENTRUNS_STREAM_POLL_SECONDS": "5",
    }
    viewers = run_stream_scenario(tmp_path, lead, gateway, env, seed=44)
    assert viewers[0].failed_connects >= 1
    stats = redis_server.client().info("commandstats")
    # nudges really crossed Redis: worker group_send (Lua) and the web's receive (BZPOPMIN)
    assert stats.get("cmdstat_bzpopmin", {}).get("calls", 0) > 0
    assert sum(v.get("calls", 0) for k, v in stats.items() if k.startswith("cmdstat_eval")) > 0
