"""How an MCP (or HTTP) tool call failed, in the engine's words (`calls.py` acts on it): our
own dependencies failing are weather; a server that could not take the call (refused the
connection, did not start, answered 429 or 503) is unreachable, nothing of the call reached it;
an answer that may come after the server ran the call (a 500, a 502/504 from its gateway, a
connection that broke after the call was sent) is a broken connection. The MCP client reports
every HTTP error status as the same JSON-RPC error, so a response hook on the HTTP transport
notes the status of each `tools/call` answer for the call that made it (`observe_http`)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from django.db import DatabaseError
from pydantic_ai.toolsets import AbstractToolset

from agentruns.registry.errors import (
    OutcomeUnknown,
    RetryableToolError,
    ServerUnavailable,
)

# by name: the MCP client (FastMCP) speaks httpx2, function tools httpx; both name them alike
_CONNECT_FAILURES = frozenset({"ConnectError", "ConnectTimeout", "ConnectionRefusedError"})
_TRANSPORT_FAILURES = _CONNECT_FAILURES | frozenset(
    {"TransportError", "ReadError", "WriteError", "RemoteProtocolError", "ReadTimeout"}
)


def _is(exc: BaseException, names: frozenset[str]) -> bool:
    """`exc` (or, for a group, each of its leaves; or what it was raised from) is one of `names`."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_is(e, names) for e in exc.exceptions)
    if any(kind.__name__ in names for kind in type(exc).__mro__):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and _is(cause, names)


_OUR_DEPENDENCIES = ("django.db", "psycopg", "psycopg_pool", "redis")


def is_ours(exc: BaseException) -> bool:
    """Raised by (or through) this app's database or Redis: left to the engine's fault rules."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, DatabaseError) or type(link).__module__.startswith(_OUR_DEPENDENCIES):
            return True
        link = link.__cause__ or link.__context__
    return False


def unreachable(exc: BaseException) -> bool:
    """The server could not be reached (nothing was sent): safe to try again with the same key."""
    return _is(exc, _CONNECT_FAILURES)


def transport_failure(exc: BaseException) -> bool:
    """The connection broke (the call may or may not have reached the server)."""
    return _is(exc, _TRANSPORT_FAILURES) or isinstance(exc, OSError | EOFError | TimeoutError)


def broken_connection(exc: BaseException) -> bool:
    """The connection of a call broke under it (not a tool's own OSError, say)."""
    return _is(exc, _TRANSPORT_FAILURES) or isinstance(exc, ConnectionError | EOFError)


# the MCP client's stand-ins, which pydantic-ai's MCPToolset turns into a ModelRetry for the model:
# an HTTP error status with no JSON-RPC answer (the server or its gateway refused the request:
# 429, 5xx; a server that ran a call answers it with 200, its errors inside) and a connection
# that closed before the answer (a stdio server that died, a dropped stream)
HTTP_ERROR_ANSWER = (-32603, "Server returned an error response")
CONNECTION_CLOSED = -32000
# the session gave up waiting for the answer (the toolset's `read_timeout`): the call was sent,
# and may have run; an answer over SSE that was an HTTP error status ends so too (the SDK's SSE
# client drops a POST's error status)
REQUEST_TIMED_OUT = -32001


# (HTTP status, Retry-After seconds) of each `tools/call` answer of the call under way: a list of
# the call's own, set in its task; the MCP session's tasks start inside the call and copy it
http_answers: ContextVar[list[tuple[int, float | None]] | None] = ContextVar(
    "agentruns_mcp_http_answers", default=None
)
# refused before processing: the server is busy or down, the call was not run
_NOT_PROCESSED = frozenset({429, 503})
# from a gateway in front of the server: it may have passed the call on (502) or given up
# waiting for the answer (504); weather for a tool that is safe to call again
_GATEWAY = frozenset({502, 504})


def observe_http(toolset: AbstractToolset) -> str:
    """Hook the streamable HTTP transports of `toolset`'s MCP servers to note each answer's
    status (the transport's own response hook, `_capture_session_id`, is wrapped: it is
    installed on whichever HTTP client the transport makes). Returns the server's name."""
    leaves: list[AbstractToolset] = []
    toolset.apply(leaves.append)
    names = []
    for leaf in leaves:
        if type(leaf).__name__ != "MCPToolset":
            continue
        names.append(str(getattr(leaf, "id", None) or getattr(leaf, "label", "MCP server")))
        transport = getattr(getattr(leaf, "client", None), "transport", None)
        original = getattr(transport, "_capture_session_id", None)
        if original is None or getattr(original, "agentruns_observed", False):
            continue  # stdio, SSE (statuses unknown: answered conservatively), or hooked already

        async def hook(response: Any, original: Any = original) -> None:
            _note_http_answer(response)
            await original(response)

        hook.agentruns_observed = True  # type: ignore[attr-defined]
        transport._capture_session_id = hook  # type: ignore[union-attr]
    return ", ".join(names) or "MCP server"


def _note_http_answer(response: Any) -> None:
    answers = http_answers.get()
    if answers is None or response.status_code < 400:
        return
    try:
        if b'"tools/call"' not in response.request.content:
            return
    except Exception:  # a streamed request body: not a call of ours
        return
    retry_after = response.headers.get("retry-after", "")
    answers.append((response.status_code, float(retry_after) if retry_after.isdigit() else None))


def error_answer(
    binding: Any,  # calls.ToolsetBinding
    name: str,
    exc: BaseException,
    answers: list[tuple[int, float | None]],
    *,
    rerun_safe: bool,
) -> None:
    """The server answered the call with an HTTP error status and no JSON-RPC answer."""
    status, retry_after = answers[-1] if answers else (None, None)
    said = f"HTTP {status}" if status is not None else "an error"
    if status in _NOT_PROCESSED or (rerun_safe and status in _GATEWAY):
        raise ServerUnavailable(
            f"{name}: {binding.server} answered {said}",
            server=binding.server,
            retry_after=retry_after,
        ) from exc
    if (status is not None and status < 500) or rerun_safe:
        # refused (a 4xx: not run), or safe to run again: the tool's retry policy decides
        raise RetryableToolError(f"{name}: server answered an error: {said}: {exc}") from exc
    raise OutcomeUnknown(
        f"{name}: the server answered {said} to the call: it may have run it before failing"
    ) from exc


def mcp_error(exc: BaseException) -> Any:
    """The MCP SDK's MCPError that `exc` was raised from, if any."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if type(link).__name__ == "MCPError" and hasattr(link, "code"):
            return link
        link = link.__cause__ or link.__context__
    return None
