"""More keys for the runs search: a domain app says which of its keys a search text stands for
(the demo: a customer's name -> the ids of that customer's orders), so the runs list, the API's
`q` and the inbox's decided view find runs by words the runs themselves do not carry (a run's
search keys are its agent's `search_fields`: the order and ticket ids).

Asked when someone searches, not when a run starts: a start costs no lookup of its own, and a
renamed customer is found by the new name at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

# a search stands for at most this many keys (a common name: its customers' newest orders)
MAX_KEYS = 50

_expansions: list[Callable[[str], Iterable[str]]] = []


def register_search_expansion(expand: Callable[[str], Iterable[str]]) -> Callable:
    """`expand(q)`: the search keys (order ids, ...) the search text `q` stands for, or none."""
    if expand not in _expansions:
        _expansions.append(expand)
    return expand


def expanded_keys(q: str) -> list[str]:
    """Every registered expansion's keys for `q`, each once, at most MAX_KEYS. A failing
    expansion costs the search its keys, never the page."""
    keys: list[str] = []
    for expand in _expansions:
        try:
            keys += [str(key) for key in expand(q) if key]
        except Exception:
            log.warning("search expansion %r failed", expand, exc_info=True)
    return list(dict.fromkeys(keys))[:MAX_KEYS]
