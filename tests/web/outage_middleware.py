"""A middleware that meets the database down outside any view, the way a session saved on the
way out would: it raises the error Django raises for a refused connection
(tests/web/test_outage_middleware.py puts it inside the real stack)."""

from __future__ import annotations

from django.db import OperationalError

DOWN_HEADER = "X-Test-Database-Down"


class DatabaseGoneOnTheWayOut:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.headers.get(DOWN_HEADER):
            raise OperationalError(
                'connection failed: connection to server at "127.0.0.1", port 1 failed: '
                "Connection refused"
            )
        return response
