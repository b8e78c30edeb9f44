"""A socket's Origin must be this app's own address exactly: scheme, host and port.

Channels' `AllowedHostsOriginValidator` compares the host alone, so a page served from
`http://127.0.0.1:9999` (another program on the same machine) could open sockets with the
user's cookie. Here the Origin must equal the address the socket itself was opened at (the
`Host` header, with `https` when the socket is `wss` or the trusted proxy header says so), or be
one of `CSRF_TRUSTED_ORIGINS` exactly; the Host must be one of `ALLOWED_HOSTS`. A socket without
an Origin or Host is refused too (browsers always send both). Refused: the handshake is denied.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": "80", "https": "443"}


def normalized(scheme: str, netloc: str) -> str:
    """`scheme://host[:port]`, lowercased, without the scheme's default port."""
    scheme, netloc = scheme.lower(), netloc.lower()
    host, port = split_domain_port(netloc)
    if not host:
        return ""
    if port == DEFAULT_PORTS.get(scheme):
        netloc = netloc.rsplit(":", 1)[0]
    return f"{scheme}://{netloc}"


def _headers(scope: dict) -> dict[str, str]:
    return {k.decode("latin1").lower(): v.decode("latin1") for k, v in scope.get("headers", [])}


def _own_scheme(scope: dict, headers: dict[str, str]) -> str:
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, value = proxy
        header = name.removeprefix("HTTP_").replace("_", "-").lower()
        if headers.get(header, "").split(",")[0].strip().lower() == value:
            return "https"
    return "https" if scope.get("scheme") in ("wss", "https") else "http"


def origin_allowed(scope: dict) -> bool:
    headers = _headers(scope)
    origin, host = headers.get("origin", ""), headers.get("host", "")
    if not origin or not host:
        return False
    domain, _ = split_domain_port(host.lower())
    if not domain or not validate_host(domain, allowed_hosts()):
        return False
    parts = urlsplit(origin)
    if parts.path or parts.query or not parts.scheme or not parts.netloc:
        return False
    given = normalized(parts.scheme, parts.netloc)
    own = normalized(_own_scheme(scope, headers), host)
    trusted = {normalized(*_scheme_netloc(o)) for o in settings.CSRF_TRUSTED_ORIGINS}
    return bool(given) and (given == own or given in trusted)


def allowed_hosts() -> list[str]:
    """ALLOWED_HOSTS as Django's own requests read it: with DEBUG and none set, the local names
    (`django-admin startproject`'s settings)."""
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


def _scheme_netloc(origin: str) -> tuple[str, str]:
    parts = urlsplit(origin)
    return parts.scheme, parts.netloc


class ExactOriginValidator:
    """ASGI middleware for the websocket side: see the module docstring."""

    def __init__(self, application) -> None:
        self.application = application

    async def __call__(self, scope, receive, send):
        if origin_allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)
