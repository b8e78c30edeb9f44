from __future__ import annotations

from django.http import HttpRequest

from agentruns.web.layout.navigation import NAV_POLL_SECONDS, fresh_nav_counts, nav_links_for


def navigation(request: HttpRequest) -> dict:
    """The navigation bar: the links other apps registered and the counts (one query), only for
    signed-in pages."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated or request.path.startswith(("/api/", "/admin/")):
        return {}
    match = getattr(request, "resolver_match", None)
    return {
        "nav": fresh_nav_counts(),
        "nav_links": nav_links_for(user, match.url_name if match else None),
        "nav_poll_seconds": NAV_POLL_SECONDS,
    }
