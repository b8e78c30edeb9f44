from __future__ import annotations

from django.http import HttpRequest

from agentruns.selectors import nav_counts


def navigation(request: HttpRequest) -> dict:
    """Counts for the navigation bar: two cheap grouped queries, only for signed-in pages."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or request.path.startswith(("/api/", "/admin/")):
        return {}
    return {"nav": nav_counts()}
