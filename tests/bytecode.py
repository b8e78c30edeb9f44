"""The checkout's bytecode, compiled once by the suite's main process before any test runs.

Every real process a test starts (daphne, qcluster, `manage.py ...`, the crash lab's workers)
imports the apps afresh: a few hundred of the checkout's modules. With PYTHONDONTWRITEBYTECODE
set (as on this machine's shells), none of them ever writes its `__pycache__`, so each of the
suite's hundreds of process starts compiled the same sources again: about 0.4 s of the 3.3 s
of CPU that importing daphne's application and the worker's command costs here. Python still
reads bytecode that is there, so it is written once, up front (a file already up to date is
only stat'ed). The venv's own packages were compiled when they were installed.
"""

from __future__ import annotations

import compileall
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = ("agentruns", "approvals", "support", "config", "tests")
SKIP = re.compile(r"[/\\]node_modules[/\\]")  # (tests/node's packages: no Python of ours)


def compile_checkout() -> None:
    for package in PACKAGES:
        compileall.compile_dir(ROOT / package, rx=SKIP, quiet=1)
