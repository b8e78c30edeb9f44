"""/healthz names the dependency that failed: Redis (with REDIS_URL set), a real redis-server
that the test stops. (The database's side: tests/web/test_database_outage.py stops PostgreSQL.)"""

from __future__ import annotations

import pytest

from tests.procs import start_redis

pytestmark = pytest.mark.django_db


def test_healthz_names_redis_when_it_stops_answering(client, settings, tmp_path):
    redis = start_redis(tmp_path)
    settings.REDIS_URL = redis.url
    try:
        up = client.get("/healthz").json()
        assert up["checks"]["redis"] == {"ok": True}
        assert "redis" not in up["failed"]
    finally:
        redis.stop()
    down = client.get("/healthz")
    assert down.status_code == 503
    body = down.json()
    assert "redis" in body["failed"] and body["checks"]["redis"]["ok"] is False
    assert body["checks"]["database"]["ok"] is True  # the database is not blamed


def test_healthz_has_no_redis_check_without_redis_url(client, settings):
    settings.REDIS_URL = ""
    assert "redis" not in client.get("/healthz").json()["checks"]
