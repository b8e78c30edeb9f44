"""What decides a user's permissions, kept per process while it has not changed.

Every API request and socket authenticates by token, and every start took a permission snapshot:
the user's permissions (two queries for a user who is not a superuser), their groups, their
groups' tool policies and the approvers' limits (two to four more), each time the same answer.
The token's query also reads the access generation (`AccessGeneration`: database triggers give
it a fresh random value on every write to groups, memberships, permissions, content types, tool
policies and rules, whoever makes it), and what is computed for a user is kept under that
generation: the first request after any such write computes afresh.

Why it cannot hand out a stale permission: the generation is read (by the token's query) before
anything is computed from the tables it guards, each under READ COMMITTED, so what is kept under
a generation is at least as new as the generation; any later write changes it. The key also
holds the user's `is_superuser` and `is_active`, which come fresh from the token's row on every
request. A user without a stamped generation (a session, an in-process caller) is computed every
time, as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from django.contrib.auth.backends import ModelBackend

from agentruns.models import AccessGeneration

T = TypeVar("T")

MAX_ENTRIES = 4096  # users x kinds of entry a process keeps (least recently used dropped)
_GENERATION = "_agentruns_access_generation"

_lock = threading.Lock()
_entries: OrderedDict[tuple, Any] = OrderedDict()
_held: list[int | None] = [None]  # the generation `_entries` belong to


def current_generation() -> int | None:
    return AccessGeneration.objects.filter(id=1).values_list("value", flat=True).first()


def stamp(user: Any, generation: int | None) -> None:
    """`user` was read under `generation`: what is computed for it may be kept under it. A user
    who is not a superuser gets its permissions from the cache too (Django's ModelBackend keeps
    them in `_perm_cache` for the rest of this request)."""
    setattr(user, _GENERATION, generation)
    if generation is not None and user.is_active and not user.is_superuser:
        user._perm_cache = remembered(
            user, "perms", lambda: frozenset(ModelBackend().get_all_permissions(user))
        )


def answers_from_memory(user: Any) -> bool:
    """`user.has_perm` answers without a query: an active superuser, or permissions stamped."""
    if getattr(user, "is_superuser", False) and getattr(user, "is_active", False):
        return True
    return hasattr(user, "_perm_cache")


def remembered(user: Any, what: Hashable, compute: Callable[[], T]) -> T:
    """`compute()`, kept for `user` under the generation it was stamped with. What it returns is
    shared between requests: return immutable values (tuples, frozensets, strings)."""
    generation = getattr(user, _GENERATION, None)
    if generation is None:
        return compute()
    key = (user.pk, user.is_superuser, user.is_active, what)
    with _lock:
        if _held[0] != generation:
            _entries.clear()
            _held[0] = generation
        elif key in _entries:
            _entries.move_to_end(key)
            return _entries[key]
    value = compute()
    with _lock:
        if _held[0] == generation:
            _entries[key] = value
            if len(_entries) > MAX_ENTRIES:
                _entries.popitem(last=False)
    return value
