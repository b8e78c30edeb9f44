"""Fixtures of the stream tests: a real redis-server on a free port, started per test."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.procs import free_port


class RedisServer:
    def __init__(self, port: int, popen: subprocess.Popen) -> None:
        self.port, self.popen = port, popen
        self.url = f"redis://127.0.0.1:{port}/0"

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    popen = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=open(tmp_path / "redis.log", "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = RedisServer(port, popen)
    deadline = time.monotonic() + 30
    while True:
        try:
            if server.client().ping():
                break
        except Exception:
            if time.monotonic() > deadline or popen.poll() is not None:
                popen.kill()
                raise
            time.sleep(0.05)
    yield server
    popen.kill()
    popen.wait(timeout=10)
