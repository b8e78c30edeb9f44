"""The layout's navigation: the links other apps add, and the live counts beside the runtime's.

A domain app (the demo's `support`, or an engineer's own) adds its pages to the base layout's
navigation by registering a link when it starts (`AppConfig.ready`), the way it registers its
agents: the runtime links to nothing it does not own and imports none of those apps. A link is
shown to whoever holds its permission.

A link may be its users' landing page (`home=True`): who holds its permission lands there after
signing in (and on `/`), the demo's support staff on the ticket queue; everyone else on the runs
list, or the inbox for who may see only that (`home`).

The counts (Inbox, Failed, Waiting, Running, Queued) are read on every page and polled by every
open page (`nav_counts_fragment`): one query (`selectors.nav_counts`), shared by a process's
requests for NAV_COUNTS_TTL_SECONDS, so a hundred open tabs cost one query per process per TTL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from threading import Lock
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.urls import NoReverseMatch, reverse
from django.views.decorators.http import require_GET

from agentruns.selectors import nav_counts

# how long one process reuses the counts it read (the poll asks every NAV_POLL_SECONDS)
NAV_COUNTS_TTL_SECONDS = 2.0
NAV_POLL_SECONDS = 5
# the inbox's count is shown to who may see the inbox (the approvals app's permission, by name)
INBOX_PERMISSION = "approvals.view_approval"


@dataclass(frozen=True)
class NavLink:
    label: str
    url_name: str  # reversed when a page renders (the app's urls may load after its ready())
    permission: str  # shown only to users who have it
    # the navigation's section names it too: `request.resolver_match.url_name` in `active_names`
    active_names: tuple[str, ...] = ()
    home: bool = False  # where its users land after signing in

    def url(self) -> str:
        try:
            return reverse(self.url_name)
        except NoReverseMatch:  # the app is installed but its urls are not: no link
            return ""


_links: dict[str, NavLink] = {}


def register_nav_link(
    label: str,
    url_name: str,
    *,
    permission: str,
    active_names: tuple[str, ...] = (),
    home: bool = False,
) -> NavLink:
    """Add a link to the layout's navigation (before the inbox); registering a url name again
    replaces its link (an app's ready() may run twice in tests). `home`: who may follow it lands
    there after signing in."""
    link = NavLink(label, url_name, permission, active_names or (url_name,), home)
    _links[url_name] = link
    return link


def nav_links_for(user: Any, current: str | None) -> list[dict[str, Any]]:
    """The registered links this user may follow: label, url and whether it is the current page."""
    shown = []
    for link in _links.values():
        if not user.has_perm(link.permission):
            continue
        url = link.url()
        if url:
            shown.append({"label": link.label, "url": url, "active": current in link.active_names})
    return shown


# a field of runs' inputs and tools' arguments whose value has its own page in a domain app (the
# demo: `ticket_id` -> the ticket), so the inbox and the run page link to it without knowing it
_record_pages: dict[str, str] = {}


def register_record_page(field: str, url_name: str) -> None:
    """`field`'s values are shown at `url_name` (reversed with the value as its one argument)."""
    _record_pages[field] = url_name


def record_url(field: str, value: object) -> str:
    """The page of `value` of `field` ("" when no app shows such records, or no value)."""
    url_name = _record_pages.get(field)
    if not url_name or not isinstance(value, str) or not value:
        return ""
    try:
        return reverse(url_name, args=[value])
    except NoReverseMatch:  # its urls are not installed, or the value is no record's id
        return ""


def landing_url(user: Any) -> str:
    """Where `user` lands: the first landing link they may follow, else the runs list (or the
    inbox, for who may see only that)."""
    for link in _links.values():
        if link.home and user.has_perm(link.permission) and (url := link.url()):
            return url
    if not user.has_perm("agentruns.view_run") and user.has_perm(INBOX_PERMISSION):
        try:
            return reverse("approval-inbox")
        except NoReverseMatch:  # the inbox app's pages are not routed here
            pass
    return reverse("run-list")


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """`/` and the page after signing in (LOGIN_REDIRECT_URL): the user's landing page."""
    return HttpResponseRedirect(landing_url(request.user))


_cached: tuple[float, dict] | None = None
_cache_lock = Lock()


def fresh_nav_counts() -> dict:
    """The counts as they are now (a page being rendered), kept for the polls that follow."""
    global _cached
    counts = nav_counts()
    _cached = (time.monotonic(), counts)
    return counts


def forget_counts() -> None:
    """The next poll reads the database (a test that changed the counts behind its back)."""
    global _cached
    _cached = None


def cached_nav_counts() -> dict:
    """The counts, read at most once per NAV_COUNTS_TTL_SECONDS by this process (the polls)."""
    cached = _cached
    if cached is not None and time.monotonic() - cached[0] < NAV_COUNTS_TTL_SECONDS:
        return cached[1]
    with _cache_lock:  # one poll per process reads; the others wait for its answer
        cached = _cached
        if cached is not None and time.monotonic() - cached[0] < NAV_COUNTS_TTL_SECONDS:
            return cached[1]
        return fresh_nav_counts()


@require_GET
@login_required
def nav_counts_fragment(request: HttpRequest) -> HttpResponse:
    """The navigation's counts as out-of-band swaps: every page's navigation polls this. Rendered
    without the request's context processors, which would read the counts afresh every time;
    each count only for whom the layout shows it."""
    user = request.user
    context = {
        "nav": cached_nav_counts(),
        "show_runs": user.has_perm("agentruns.view_run"),
        "show_inbox": user.has_perm(INBOX_PERMISSION),
    }
    html = render_to_string("agentruns/_nav_counts.html", context)
    response = HttpResponse(html)
    response["Cache-Control"] = "no-store"
    return response
