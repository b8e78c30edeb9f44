"""One backoff implementation: every delay before another try (a tool's retry policy, a model
or tool outage, the worker loops riding out an outage, psycopg's reconnections, the webhook
deliveries) comes from `agentruns/backoff.py`, the only code that draws jitter."""

from __future__ import annotations

import ast
from pathlib import Path

from agentruns import backoff
from agentruns.registry import RetryPolicy

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_backoff_module_draws_jitter_or_defines_a_backoff():
    others = []
    for package in ("agentruns", "approvals"):
        for path in (ROOT / package).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            if "/migrations/" in name or name == "agentruns/backoff.py":
                continue
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import | ast.ImportFrom) and any(
                    alias.name == "random" for alias in node.names
                ):
                    others.append(f"{name}:{node.lineno} imports random")
                if isinstance(node, ast.ClassDef) and node.name.endswith("Backoff"):
                    bases = {ast.unparse(b) for b in node.bases}
                    if not bases & {"base.AttemptWithBackoff"}:  # psycopg's own, capped
                        others.append(f"{name}:{node.lineno} defines {node.name}")
    assert others == []


def test_the_delays_double_up_to_the_cap_within_the_jitter():
    assert [backoff.delay(n, base=1, cap=10, jitter=0) for n in (1, 2, 3, 4, 5)] == [
        1,
        2,
        4,
        8,
        10,
    ]
    assert backoff.delay(3, base=1, cap=100, factor=4, jitter=0.2, at=-1) == 16 * 0.8
    spread = {backoff.delay(2, base=1, cap=10, jitter=0.25) for _ in range(200)}
    assert min(spread) >= 1.5 and max(spread) <= 2.5 and len(spread) > 100
    policy = RetryPolicy(backoff_seconds=0.5, backoff_max_seconds=2, jitter=0)
    assert [policy.delay_for(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 2.0]
