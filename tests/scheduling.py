"""The order modules are handed to xdist workers in: the slowest first.

`make test` runs `--dist loadscope --no-loadscope-reorder`: every module goes to one worker as
a whole, in collection order, the next one to whichever worker runs dry. That keeps a module's
tests together, so its module-scoped fixtures (a shared daphne, MCP server or OTLP receiver)
start once in the whole suite, and lets a few drills of minutes run beside the quick tests
instead of after them: here the modules are sorted by their expected seconds, the slowest
first (a longest-processing-time-first schedule; the quick ones fill the end). Inside a module
the order stays as collected (pytest-django's database kinds first); nothing is skipped or
changed. Without xdist (`-n 0`) the collection order stays as it is.

The expected seconds are pytest's own `--durations` lines kept in tests/durations.txt (setup,
call and teardown of a test are added up); a test not listed there is estimated by its marks.
Regenerate the file from a suite run: `make test PYTEST_ARGS=--durations=0 | grep -E
'^[0-9.]+s (setup|call|teardown) ' > tests/durations.txt` (every test: a module left out is
guessed by its marks, and a guess far too low puts a minute of work at the suite's end; drop the
first setups of each worker: they create its test database).
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


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def slowest_modules_first(items: list[pytest.Item], measured: dict[str, float]) -> list:
    """`items` grouped by module, the modules by their expected seconds (ties: as collected)."""
    modules: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        modules[module_of(item)].append(item)
    seconds = {m: sum(expected_seconds(i, measured) for i in its) for m, its in modules.items()}
    ranked = sorted(modules, key=lambda m: -seconds[m])  # (sorted is stable)
    return [item for module in ranked for item in modules[module]]


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering (its database kinds)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config, "workerinput", None) is None:  # (an xdist worker's own --dist is "no")
        return
    items[:] = slowest_modules_first(items, measured_seconds())
