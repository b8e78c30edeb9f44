"""Who may read the operational endpoints: /metrics, and the details of /healthz.

A scraper sending `Authorization: Bearer <AGENTRUNS_METRICS_TOKEN>`, a client whose address is in
AGENTRUNS_METRICS_ALLOW (addresses or networks, e.g. `10.0.0.0/8`; default the loopback, so a
scraper or probe on the machine itself works as before), or a signed-in staff user. Anyone else
gets 403 from /metrics and only `{"status": ...}` from /healthz, which is what a load balancer
needs (its status code is the same for everyone). Behind a proxy on the same machine every
client's address is the loopback: set the allow-list to the scrapers' addresses (or empty).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import Callable
from functools import wraps

from django.http import HttpRequest, HttpResponse, JsonResponse

from agentruns.conf import conf
from agentruns.tokens import bearer_from_header


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [
        ipaddress.ip_network(entry.strip(), strict=False)
        for entry in conf.METRICS_ALLOW.split(",")
        if entry.strip()
    ]


def may_read_operations(request: HttpRequest) -> bool:
    expected = conf.METRICS_TOKEN
    sent = bearer_from_header(request.headers.get("Authorization"))
    if expected and sent and hmac.compare_digest(sent.encode(), expected.encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        address = None
    if address is not None and any(address in net for net in _allowed_networks()):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff)


def operators_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def guarded(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not may_read_operations(request):
            return HttpResponse(
                "metrics need AGENTRUNS_METRICS_TOKEN, an allowed address or a staff login\n",
                status=403,
                content_type="text/plain; charset=utf-8",
            )
        return view(request, *args, **kwargs)

    return guarded


def details_for_operators(view: Callable[..., JsonResponse]) -> Callable[..., JsonResponse]:
    @wraps(view)
    def trimmed(request: HttpRequest, *args, **kwargs) -> JsonResponse:
        response = view(request, *args, **kwargs)
        if may_read_operations(request):
            return response
        status = json.loads(response.content).get("status")
        return JsonResponse({"status": status}, status=response.status_code)

    return trimmed
