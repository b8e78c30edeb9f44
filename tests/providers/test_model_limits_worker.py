"""The provider's rate limit kept in advance, with real processes: 24 refund runs started at once
through a real `qcluster` against the fake OpenAI-compatible server (a process of its own)
limited to 600 requests a minute and 10 in any second, answering 429 beyond either as providers
do. The server counts what it refused: nothing. Meanwhile most runs wait for their slots queued,
with no lease (so no slot of the worker's pool, no thread), saying why. (The full size, 500 runs
at 120 a minute, is in `make bench`: benchmarks/model_rate_limit.py.)"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agentruns.models import Run, RunStatus
from agentruns.runtime.access.model_limits import WAITING, request_interval
from agentruns.services import start_run
from scripts.fake_openai_server import ProviderLimit
from tests.procs import (
    Proc,
    base_env,
    free_port,
    gateway_refunds,
    start_web,
    start_worker,
    wait_http,
    wait_until,
)
from tests.providers.kit import API_KEY, MODEL

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 24
RPM = 600  # 10 a second
# the suite shares 2 cores with other suites (load 8-13 seen): now and then a request reached the
# provider more than 0.5 s after its slot then, so the allowance is far wider than the default
# 0.25 s; a slot every (1 + 1) / 10 s: the ~96 requests take ~19 s
JITTER = 1.0


@pytest.mark.django_db(transaction=False)
def test_the_fake_provider_refuses_beyond_a_second_and_a_minute(monkeypatch):
    """The fake server's limit itself: at most ceil(rpm / 60) in any second and rpm in any
    minute, counted on its own clock; a refused request does not count."""
    now = [1000.0]
    monkeypatch.setattr("scripts.fake_openai_server.time.monotonic", lambda: now[0])
    limit = ProviderLimit(rpm=120)  # 2 a second
    assert [limit.admit(), limit.admit()] == [None, None]
    now[0] += 0.4
    assert limit.admit() == pytest.approx(0.6)  # a third within the second: 429
    now[0] += 0.6
    assert limit.admit() is None  # the first two have left the second
    assert (limit.admitted, limit.refused) == (3, 1)

    minute = ProviderLimit(rpm=6, per_second=6)
    for _ in range(6):
        assert minute.admit() is None
        now[0] += 0.1
    now[0] += 29.4  # 30 s after the first
    assert minute.admit() == pytest.approx(30.0)
    now[0] += 30.0
    assert minute.admit() is None


def start_fake_provider(tmp_path: Path) -> tuple[Proc, str]:
    """The fake server as a process of its own, as a provider is: its clock counts arrivals
    without waiting for this process's threads."""
    port = free_port()
    server = Proc(
        [
            sys.executable,
            "scripts/fake_openai_server.py",
            f"--port={port}",
            "--mode=refund",
            "--delay-ms=5",
            f"--api-key={API_KEY}",
            f"--rpm={RPM}",
        ],
        base_env(),
        tmp_path / "fake-provider.log",
    ).start()
    url = f"http://127.0.0.1:{port}/v1"
    wait_http(url + "/models", server)
    return server, url


def test_runs_started_at_once_keep_the_providers_limit_and_wait_without_a_slot(
    tmp_path: Path, seeded
):
    provider, provider_url = start_fake_provider(tmp_path)
    env = {
        "AGENTRUNS_MODEL": MODEL,
        "OPENAI_BASE_URL": provider_url,
        "OPENAI_API_KEY": API_KEY,
        "AGENTRUNS_MODEL_LIMITS": json.dumps({MODEL: {"rpm": RPM}}),
        "AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS": str(JITTER),
        "AGENTRUNS_RUN_CLAIM_POLL_SECONDS": "0.2",  # a woken run is claimed within 0.2 s
    }
    web, url = start_web(tmp_path, **env)
    worker = start_worker(tmp_path, REFUND_GATEWAY_URL=url + "/gateway", **env)
    samples: list[tuple[int, int]] = []  # (running, queued waiting on the rate limit)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rows = list(Run.objects.values_list("status", "error"))
            running = sum(1 for status, _ in rows if status == RunStatus.RUNNING)
            waiting = sum(
                1 for status, error in rows if status == RunStatus.QUEUED and WAITING in error
            )
            samples.append((running, waiting))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        ids = [
            start_run(
                "refund",
                {"order_id": f"ORD-{1001 + i}", "message": "It arrived broken, refund it"},
                model=MODEL,
            ).run.id
            for i in range(RUNS)
        ]
        sampler.start()
        started = time.monotonic()
        wait_until(
            lambda: Run.objects.filter(id__in=ids, finished_at__isnull=False).count() == RUNS,
            timeout=150,
            interval=0.5,
            message=f"{RUNS} runs to finish",
        )
        wall = time.monotonic() - started
        ledger = gateway_refunds(url)
        counted = httpx.get(provider_url + "/_fake/limit", timeout=10).json()
    finally:
        done.set()
        sampler.join(5)
        for proc in (worker, web, provider):
            proc.stop()

    runs = list(Run.objects.filter(id__in=ids))
    assert {r.status for r in runs} == {RunStatus.SUCCEEDED}, [(r.status, r.error) for r in runs]
    # the outside world: one refund per order, and not one request the provider refused
    assert sorted(r["order_id"] for r in ledger) == sorted(f"ORD-{1001 + i}" for i in range(RUNS))
    assert counted["refused"] == 0, f"{counted['refused']} requests answered 429"
    assert counted["admitted"] >= 4 * RUNS
    # the requests went at the limit's pace, not in a burst
    assert wall >= (counted["admitted"] - 1) * request_interval(RPM, JITTER) * 0.95
    # the waiting runs held no slot: at one moment half of them or more waited queued, leaseless
    most_waiting = max(w for _, w in samples)
    assert most_waiting >= RUNS // 2, samples
    running = sorted(r for r, _ in samples if r)
    print(
        f"{counted['admitted']} requests in {wall:.1f} s, 0 x 429; up to {most_waiting} runs "
        f"queued for their slots at once, a median {running[len(running) // 2]} running"
    )
