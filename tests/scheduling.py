"""The order tests are handed to xdist workers in: the slowest first, dealt evenly.

`--dist worksteal` splits the collected list into one contiguous chunk per worker and, when a
worker runs dry, moves half of the longest queue's tail to it. In collection order the slow
tests (real processes, SIGKILL drills, browsers) sit in a few directories, so one worker's chunk
holds most of them and the suite waits for that worker alone at the end. Here the tests are
sorted by their expected seconds and dealt to the chunks in a snake (0, 1, 2, 2, 1, 0, ...):
every chunk starts with its share of the slow tests and ends with quick ones, which are what
stealing moves. Nothing is skipped or changed, only the order; without xdist (`-n 0`) the
collection order stays as it is.

The expected seconds are pytest's own `--durations` lines kept in tests/durations.txt (setup,
call and teardown of a test are added up); a test not listed there is estimated by its marks.
Regenerate the file from a suite run: `pytest -n 3 --dist worksteal --durations=150 | grep -E
'^[0-9.]+s (setup|call|teardown) ' > tests/durations.txt`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.txt")
LINE = re.compile(r"^\s*([0-9.]+)s\s+(?:setup|call|teardown)\s+(\S+)")
# seconds for a test the file does not list
SLOW_MARKS = {"crash": 15.0, "e2e": 8.0, "slow": 15.0}
TRANSACTIONAL = 1.5  # tables truncated after it; most of them start real processes
DEFAULT = 0.3


def measured_seconds(path: Path = DURATIONS) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    if path.exists():
        for line in path.read_text().splitlines():
            if match := LINE.match(line):
                seconds[match.group(2)] += float(match.group(1))
    return seconds


def expected_seconds(item: pytest.Item, measured: dict[str, float]) -> float:
    if item.nodeid in measured:
        return measured[item.nodeid]
    marks = {mark.name for mark in item.iter_markers()}
    estimate = max((SLOW_MARKS[m] for m in marks & SLOW_MARKS.keys()), default=0.0)
    if not estimate:
        db = item.get_closest_marker("django_db")
        estimate = TRANSACTIONAL if db is not None and db.kwargs.get("transaction") else DEFAULT
    return estimate


def snake_chunks(items: list, workers: int) -> list:
    """`items` (slowest first) dealt to `workers` chunks in a snake, the chunks concatenated."""
    chunks: list[list] = [[] for _ in range(workers)]
    for n, item in enumerate(items):
        lap, seat = divmod(n, workers)
        chunks[seat if lap % 2 == 0 else workers - 1 - seat].append(item)
    return [item for chunk in chunks for item in chunk]


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering (its database kinds)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    worker_input = getattr(config, "workerinput", None)
    if worker_input is None:  # (a worker's own --dist is "no": every xdist mode is ordered)
        return
    measured = measured_seconds()
    position = {id(item): n for n, item in enumerate(items)}
    ranked = sorted(items, key=lambda i: (-expected_seconds(i, measured), position[id(i)]))
    items[:] = snake_chunks(ranked, int(worker_input["workercount"]))
