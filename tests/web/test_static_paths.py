"""/static/ through daphne: a path that climbs out of the static directories, or holds a NUL
byte, is a 404 (it was a 500), and real files are still served."""

from __future__ import annotations

import httpx
import pytest

from tests.procs import start_web


@pytest.mark.django_db(transaction=True)
def test_hostile_static_paths_are_404(tmp_path):
    web, url = start_web(tmp_path)
    try:
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/static/agentruns/runstream.js").status_code == 200
            for raw in (
                "/static/%2e%2e/config/settings.py",
                "/static/..%2f..%2fconfig%2fsettings.py",
                "/static/agentruns/%00runstream.js",
                "/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
            ):
                response = http.get(httpx.URL(url + raw))
                assert response.status_code == 404, (raw, response.status_code)
        assert "Internal Server Error" not in web.log() and "Traceback" not in web.log()
    finally:
        web.kill()
