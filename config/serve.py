"""`python -m config.serve [--idle-timeout S] <daphne's arguments>`: daphne, with an access log
that holds no credentials and a settable idle timeout for HTTP connections.

daphne writes each request's path with its query string to the access log, so a client that
puts a token in the URL (`?access_token=art_...`, refused by the app, which reads tokens only
from the Authorization header) would leave it in the log. This entry point is daphne's own
command line with one change: every logged path has the values of credential-like query
parameters masked, and anything that looks like a credential anywhere in it (our `art_` tokens,
`sk-` keys, `Bearer ...`) masked too (`runtime/values/redaction.py`'s patterns, as in every log line).

`--idle-timeout` (seconds, default 60: Twisted's own): an HTTP connection that sends nothing for
this long while its request is incomplete (or between keep-alive requests) is closed. It is an
idle timeout, not a deadline: a client trickling a byte at a time keeps it open, so a proxy in
front must bound whole requests (README, "Production").
"""

from __future__ import annotations

import re
import sys
from urllib.parse import parse_qsl, quote, urlsplit

import daphne.cli
import daphne.server
from daphne import http_protocol
from daphne.access import AccessLogGenerator

from agentruns.runtime.values.redaction import MASK, redact_text

# query parameters whose values are never written to the log, whatever they look like
SECRET_PARAMETER = re.compile(r"(?i)token|key|secret|pass|auth|sig|session|credential|code")


def redacted_path(path: str) -> str:
    """The path for the log: credential-like query values and credential patterns masked."""
    parts = urlsplit(path)
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        shown = "&".join(
            f"{quote(name, safe='')}={MASK if SECRET_PARAMETER.search(name) else quote(value, safe='')}"
            for name, value in pairs
        )
        path = parts.path + "?" + shown
    return redact_text(path)


class RedactingAccessLog(AccessLogGenerator):
    def __call__(self, protocol, action, details):
        if isinstance(details, dict) and isinstance(details.get("path"), str):
            details = {**details, "path": redacted_path(details["path"])}
        return super().__call__(protocol, action, details)


def idle_timeout_from(argv: list[str]) -> tuple[float, list[str]]:
    """Our one option, taken off the arguments (the rest are daphne's)."""
    seconds, rest, args = 60.0, [], iter(argv)
    for arg in args:
        if arg == "--idle-timeout":
            seconds = float(next(args))
        elif arg.startswith("--idle-timeout="):
            seconds = float(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return seconds, rest


def with_idle_timeout(seconds: float) -> type:
    class IdleTimeoutHTTPFactory(http_protocol.HTTPFactory):
        def __init__(self, server) -> None:
            super().__init__(server)
            self.timeOut = seconds  # Twisted's idle timeout of each connection it builds

    return IdleTimeoutHTTPFactory


def main() -> None:
    seconds, sys.argv[1:] = idle_timeout_from(sys.argv[1:])
    daphne.server.HTTPFactory = with_idle_timeout(seconds)  # the one the server builds
    daphne.cli.AccessLogGenerator = RedactingAccessLog  # the one the command line builds
    sys.exit(daphne.cli.CommandLineInterface.entrypoint())


if __name__ == "__main__":
    main()
