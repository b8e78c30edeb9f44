"""What an agent declares about runs of it that share a business key (issue 30):

    register_agent(agent, concurrency_key=lambda input: input["order_id"], concurrency=1,
                   release_while_waiting=False)

Runs of the agent whose input gives the same key take at most `concurrency` places at once; the
others wait queued, in start order, saying which run they wait behind. A run parked for a person
keeps its place unless `release_while_waiting`. The runtime enforces it
(`agentruns/runtime/dispatch/concurrency.py`); this module only keeps the declarations, checked
at start-up, for an `Agent` and a `pydantic_ai.Agent` alike.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

OPTIONS = ("concurrency_key", "concurrency", "release_while_waiting")


@dataclass(frozen=True)
class Concurrency:
    key: Callable[[Any], Any]  # the run's input -> its key (None: this run has none)
    limit: int = 1
    release_while_waiting: bool = False


_declared: dict[str, Concurrency] = {}


def take(options: MutableMapping[str, Any]) -> dict[str, Any]:
    """Pop this module's keywords out of `register_agent`'s options."""
    return {name: options.pop(name) for name in OPTIONS if name in options}


def declare(agent: str, options: dict[str, Any]) -> None:
    """Keep (or, registered again without them, forget) the agent's declaration; a declaration
    that cannot work fails here, at start-up, naming the agent."""
    where = f"agent {agent!r}"
    key = options.get("concurrency_key")
    if key is None:
        if len(options) > ("concurrency_key" in options):
            raise TypeError(
                f"{where}: concurrency= and release_while_waiting= need a concurrency_key"
            )
        _declared.pop(agent, None)
        return
    if not callable(key):
        raise TypeError(f"{where}: concurrency_key must be a function of the run's input")
    limit = options.get("concurrency", 1)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"{where}: concurrency must be a whole number of runs, at least 1")
    release = options.get("release_while_waiting", False)
    if not isinstance(release, bool):
        raise TypeError(f"{where}: release_while_waiting must be True or False")
    _declared[agent] = Concurrency(key, limit, release)


def concurrency_of(agent: str) -> Concurrency | None:
    """The agent's declaration in this process (None: no key, or the agent is not deployed)."""
    return _declared.get(agent)
