"""Fixtures of the stream tests: a real redis-server on a free port, started per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.procs import RedisServer, start_redis


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    server = start_redis(tmp_path)
    yield server
    server.stop()
