"""/metrics of a real daphne whose PostgreSQL (a private server) is stopped and started again:
it keeps answering, and says what the web process sees of the database."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.pgserver import PrivatePostgres
from tests.procs import start_web

pytestmark = pytest.mark.crash


def web_database_up(url: str) -> float:
    response = httpx.get(f"{url}/metrics", timeout=30)
    assert response.status_code == 200, response.text[:500]
    for family in text_string_to_metric_families(response.text):
        if family.name == "agentruns_process_database_up":
            (web,) = [s for s in family.samples if s.labels["role"] == "web"]
            return web.value
    raise AssertionError("no agentruns_process_database_up in /metrics")


def test_metrics_answer_with_the_database_down(tmp_path, procs):
    pg = PrivatePostgres("metrics")
    try:
        pg.start()
        pg.create_database()
        # a request waits up to DB_POOL_TIMEOUT for a connection: that bounds the answer's time
        env = {"DATABASE_URL": pg.url, "AGENTRUNS_METRICS_CACHE_SECONDS": 0, "DB_POOL_TIMEOUT": 2}
        pg.migrate(seed=False)
        web, url = start_web(tmp_path, **env)
        procs.append(web)
        assert web_database_up(url) == 1
        pg.stop()
        assert web_database_up(url) == 0
        pg.start()
        pg.wait_up()
        assert web_database_up(url) == 1
    finally:
        pg.close()
