"""The base layout's navigation, read by the layout itself (`agentruns/base.html`), so the apps'
pages need no context processor in the host's TEMPLATES settings.

    {% load agentruns_layout %}{% layout_navigation as layout %}

`layout` holds `nav` (the counts), `links` (the links other apps registered that this user may
follow), `poll_seconds`, `home_url` and `logout_url` (the host's `logout` view, else the
admin's, else none: no sign-out button). Empty for anonymous requests and pages rendered without
a request (the outage page: the navigation reads the database).
"""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import NoReverseMatch, reverse

from agentruns.web.layout.navigation import NAV_POLL_SECONDS, fresh_nav_counts, nav_links_for

register = template.Library()

# the sign-out form posts to the first of these the host's URLconf names
LOGOUT_URL_NAMES = ("logout", "admin:logout")


def _first_url(names: tuple[str, ...]) -> str:
    for name in names:
        try:
            return reverse(name)
        except NoReverseMatch:
            continue
    return ""


@register.simple_tag(takes_context=True)
def layout_navigation(context: template.Context) -> dict[str, Any]:
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    match = getattr(request, "resolver_match", None)
    return {
        "nav": fresh_nav_counts(),
        "links": nav_links_for(user, match.url_name if match else None),
        "poll_seconds": NAV_POLL_SECONDS,
        "home_url": _first_url(("run-list",)),
        "logout_url": _first_url(LOGOUT_URL_NAMES),
    }


@register.simple_tag
def nav_counts() -> dict:
    """The navigation's counts as they are now, for a fragment that swaps them out of band
    (a decision's answer: the inbox's count changed)."""
    return fresh_nav_counts()
