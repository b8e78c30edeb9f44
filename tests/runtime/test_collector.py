"""The worker process's collector tuning (runtime/workers/collector.py), in a process of its own:
start-up objects frozen, young collections rarer, and garbage cycles still collected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, weakref
from agentruns.runtime.workers import collector

class Node:
    pass

collector.tune()
assert gc.get_freeze_count() > 1000, gc.get_freeze_count()
assert gc.get_threshold()[0] == collector.YOUNG_THRESHOLD, gc.get_threshold()
a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: reference counting alone never frees it
gone = weakref.ref(a)
del a, b
gc.collect()
assert gone() is None, "a cycle made after tune() was not collected"
print("ok")
"""


def test_tune_freezes_start_up_and_still_collects_cycles() -> None:
    env = {"DJANGO_SETTINGS_MODULE": "config.settings", "PATH": "/usr/bin:/bin"}
    script = "import django; django.setup()\n" + PROBE
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
