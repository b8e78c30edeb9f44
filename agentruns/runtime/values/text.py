"""What any text or JSON must be before it is stored or sent, in one place.

PostgreSQL refuses a NUL byte in text and jsonb, and jsonb refuses NaN, Infinity and lone
surrogate escapes; a lone surrogate cannot be encoded as UTF-8 on the way out of any page,
socket or log. So:

- `loads_strict` / `check_value` refuse such input (the API and the gateway turn the refusal
  into a 400 naming the field): no NaN or Infinity, no integer past 2^63 - 1 or longer than
  `MAX_NUMBER_CHARS`, no nesting deeper than `MAX_DEPTH`, no NUL and no lone surrogate;
- `storable` repairs what the runtime cannot refuse (a model's text, a tool's result) so the
  commit that records it cannot fail: NUL and lone surrogates become U+FFFD, a non-finite float
  becomes null;
- `printable` is the last line for output: any lone surrogate that is already stored (SQLite
  keeps them in JSON) becomes U+FFFD, so no row can break a page, a frame or a JSON answer.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 32
INT_LIMIT = 2**63 - 1
MAX_NUMBER_CHARS = 40
REPLACEMENT = "\ufffd"

_SURROGATE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class UnsafeValue(ValueError):
    """Input no column or consumer can hold; the message names where it is."""


def _reject_constant(name: str) -> Any:
    raise UnsafeValue(f"{name} is not a JSON number")


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise UnsafeValue(f"number {text[:20]}… is too long")
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeValue(f"number {text[:20]} is out of range")
    return value


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise UnsafeValue(f"integer {text[:20]}… is too large")
    value = int(text)
    if abs(value) > INT_LIMIT:
        raise UnsafeValue(f"integer {text} is out of range (at most 2^63 - 1)")
    return value


def check_text(value: str, where: str) -> None:
    if "\x00" in value:
        raise UnsafeValue(f"{where}: NUL bytes are not allowed in text")
    if _SURROGATE.search(value):
        raise UnsafeValue(f"{where}: lone surrogates are not allowed in text")


def check_value(value: Any, where: str = "body", depth: int = 0) -> None:
    """Every string and key storable and printable as UTF-8; numbers finite and bounded;
    depth bounded."""
    if not _plainly_safe(value, depth):
        _refuse_unsafe(value, where, depth)


def _plainly_safe(value: Any, depth: int) -> bool:
    """`check_value`'s rules for plain JSON values, naming nothing: a tool call's arguments are
    checked on every step, and building each item's path costs more than checking it. False
    also for a type it does not know (a subclass of one): `_refuse_unsafe` decides those."""
    kind = type(value)
    if kind is str:
        return "\x00" not in value and _SURROGATE.search(value) is None
    if value is None or kind is bool:
        return True
    if kind is int:
        return -INT_LIMIT <= value <= INT_LIMIT
    if kind is float:
        return math.isfinite(value)
    if kind is dict or kind is list or kind is tuple:
        if depth >= MAX_DEPTH:  # its items would be nested too deep
            return not value
    if kind is dict:
        return all(
            type(key) is str
            and "\x00" not in key
            and _SURROGATE.search(key) is None
            and _plainly_safe(item, depth + 1)
            for key, item in value.items()
        )
    if kind is list or kind is tuple:
        return all(_plainly_safe(item, depth + 1) for item in value)
    return False


def _refuse_unsafe(value: Any, where: str, depth: int) -> None:
    """`check_value` with the path of each item, for the message of what it refuses."""
    if depth > MAX_DEPTH:
        raise UnsafeValue(f"{where}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if abs(value) > INT_LIMIT:
            raise UnsafeValue(f"{where}: integer out of range (at most 2^63 - 1)")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UnsafeValue(f"{where}: number out of range")
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise UnsafeValue(f"{where}: keys must be strings")
            check_text(key, f"{where} (a key)")
            _refuse_unsafe(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _refuse_unsafe(item, f"{where}[{i}]", depth + 1)


# one decoder for every call: `json.loads` with hooks builds a decoder each time, which costs
# three times the parse of a tool call's arguments
_STRICT_JSON = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_parse_float, parse_int=_parse_int
)


def loads_strict(raw: bytes | str, where: str = "body", *, repair_text: bool = False) -> Any:
    """Strict JSON (see the module docstring); UnsafeValue for anything else. `repair_text`:
    NUL and lone surrogates in strings become U+FFFD instead (what a model wrote, which the
    runtime cannot send back to a client as a 400)."""
    try:
        if isinstance(raw, bytes | bytearray):  # as `json.loads` reads bytes
            raw = raw.decode(json.detect_encoding(raw), "surrogatepass")
        data = _STRICT_JSON.decode(raw)
    except UnsafeValue:
        raise
    except RecursionError:
        raise UnsafeValue(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnsafeValue(f"malformed JSON: {exc}") from None
    if _plainly_safe(data, 0):
        return data
    if repair_text:
        data = storable(data)
    check_value(data, where)
    return data


def storable_text(value: str) -> str:
    return _UNSTORABLE.sub(REPLACEMENT, value) if _UNSTORABLE.search(value) else value


def storable(value: Any) -> Any:
    """A copy of a JSON-like value that any column holds (see the module docstring)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {storable_text(str(k)): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value


def printable(text: str) -> str:
    """`text` encodable as UTF-8: lone surrogates become U+FFFD."""
    return _SURROGATE.sub(REPLACEMENT, text) if _SURROGATE.search(text) else text
