"""`python -m config.serve [--idle-timeout S] [--backlog N] <daphne's arguments>`: daphne, with an
access log that holds no credentials, a settable idle timeout for HTTP connections and a listen
backlog that a burst of connections does not overflow.

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

`--backlog` (default 1024; the kernel caps it at `net.core.somaxconn`): the listen queue of
the `-b/-p` and `-u` sockets. Twisted's default is 50: 300 chats opened at once had 5-11
connections reset before daphne accepted them, where the app would have answered 429 with
Retry-After; with 1024, none were.
"""

from __future__ import annotations

import re
import sys
from urllib.parse import parse_qsl, quote, urlsplit

import daphne.cli
import daphne.endpoints
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


OURS = {"--idle-timeout": 60.0, "--backlog": 1024.0}


def our_options_from(argv: list[str]) -> tuple[dict[str, float], list[str]]:
    """Our options, taken off the arguments (the rest are daphne's)."""
    found, rest, args = dict(OURS), [], iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in OURS:
            found[name] = float(value if eq else next(args))
        else:
            rest.append(arg)
    return found, rest


def with_backlog(backlog: int):
    """daphne's endpoint strings for -b/-p and -u, with a listen backlog (fd: already listening)."""

    def endpoints(host=None, port=None, unix_socket=None, file_descriptor=None) -> list[str]:
        built = daphne.endpoints.build_endpoint_description_strings(
            host, port, unix_socket, file_descriptor
        )
        return [f"{d}:backlog={backlog}" if d.startswith(("tcp:", "unix:")) else d for d in built]

    return endpoints


def with_idle_timeout(seconds: float) -> type:
    class IdleTimeoutHTTPFactory(http_protocol.HTTPFactory):
        def __init__(self, server) -> None:
            super().__init__(server)
            self.timeOut = seconds  # Twisted's idle timeout of each connection it builds

    return IdleTimeoutHTTPFactory


def main() -> None:
    options, sys.argv[1:] = our_options_from(sys.argv[1:])
    daphne.server.HTTPFactory = with_idle_timeout(options["--idle-timeout"])  # the server's
    daphne.cli.build_endpoint_description_strings = with_backlog(int(options["--backlog"]))
    daphne.cli.AccessLogGenerator = RedactingAccessLog  # the one the command line builds
    sys.exit(daphne.cli.CommandLineInterface.entrypoint())


if __name__ == "__main__":
    main()
