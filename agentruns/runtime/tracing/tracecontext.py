"""W3C trace context of runs (https://www.w3.org/TR/trace-context/), without the SDK.

A run outlives the processes that execute it, so the ids of its long spans cannot live in any
one process's memory: the trace id is stored on the run when it starts (the caller's, when the
request carried a `traceparent`), and the ids of the spans that begin in one process and end in
another are derived from the run: the root span's from the run id, a worker's slice from the run
id and the lease owner (unique per executor), so whichever process ends such a span (or finds it
abandoned by a dead worker) names it exactly as the children that were already exported did.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
SAMPLED = 0x01


def parse_traceparent(value: str | None) -> tuple[str, str, int] | None:
    """(trace id, parent span id, flags) of a valid header; None for anything else (W3C: an
    invalid traceparent is ignored and a new trace starts, it is no reason to refuse a call)."""
    match = _TRACEPARENT.match((value or "").strip().lower()[:512])
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE:
        return None
    if span_id == _ZERO_SPAN:
        return None
    return trace_id, span_id, int(flags, 16)


def new_run_trace(traceparent: str | None) -> tuple[str, str]:
    """(trace_id, trace_parent) to store on a new run: the caller's trace when it sent one."""
    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return secrets.token_hex(16), ""
    trace_id, span_id, flags = parsed
    return trace_id, format_traceparent(trace_id, int(span_id, 16), flags)


def _derived_span_id(*parts: bytes) -> int:
    digest = hashlib.blake2b(b"\0".join(parts), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1  # 0 is the invalid span id


def root_span_id(run_id: uuid.UUID) -> int:
    """The span id of the run's `invoke_agent` span."""
    return _derived_span_id(b"run", run_id.bytes)


def slice_span_id(run_id: uuid.UUID, owner: str) -> int:
    """The span id of the slice a lease owner (one executor) worked on the run."""
    return _derived_span_id(b"slice", run_id.bytes, owner.encode())


def caller_flags(trace_parent: str) -> int:
    parsed = parse_traceparent(trace_parent)
    return parsed[2] if parsed is not None else SAMPLED


def format_traceparent(trace_id: str | int, span_id: int, flags: int = SAMPLED) -> str:
    trace_hex = trace_id if isinstance(trace_id, str) else f"{trace_id:032x}"
    return f"00-{trace_hex}-{span_id:016x}-{flags:02x}"


def run_traceparent(run_id: uuid.UUID, trace_id: str, trace_parent: str = "") -> str:
    """A `traceparent` naming the run's root span (for calls made outside any live span)."""
    if not trace_id:
        return ""
    return format_traceparent(trace_id, root_span_id(run_id), caller_flags(trace_parent))
