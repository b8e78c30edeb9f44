"""The cyclic garbage collector of a worker process that carries hundreds of runs (issue 22).

Measured at 1000 sleeping runs in flight on the default deployment (`benchmarks.profile_worker`
with its GC probe): the collector took 6-9 ms of a run's ~14 ms of worker CPU, and every thread
of the process waits while it runs. Two causes: full collections walk every object of the
process, most of them the imports and set-up that live as long as it does (Django, the app
registry, the agents, pydantic's schemas); and young collections every 700 allocations promote
the objects of the runs in flight, whose steps allocate thousands, to the older generations.

So, once q2 has spawned the process (`tune`, on its `post_spawn` signal): `gc.freeze()` moves
what exists so far into the permanent generation, which collections no longer walk, and the
young generation is collected every YOUNG_THRESHOLD allocations instead. Nothing the engine
relies on changes: reference counting still frees nearly everything at once, and cycles are
still collected, less often.
"""

from __future__ import annotations

import gc
from typing import Any

YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)


def tune(**_: Any) -> None:
    gc.collect()  # what start-up left as garbage is not frozen with the rest
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
