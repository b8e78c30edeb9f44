"""`python manage.py crashlab`: the A/B crash experiment (docs/crashlab.md)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from django.core.management.base import BaseCommand

from support.crashlab import as_json, run_lab, verdict

COLUMNS = [
    ("group", 5),
    ("fault", 20),
    ("run_id", 10),
    ("step_id", 10),
    ("attempt", 7),
    ("tool", 12),
    ("operation_key", 30),
    ("step_status", 17),
    ("refunds_executed", 8),
    ("final_status", 10),
]
HEADERS = {"refunds_executed": "refunds", "final_status": "run", "operation_key": "operation key"}


class Command(BaseCommand):
    help = "Hard-kill a real worker at four fault points, naive task vs durable engine; exits 1 if the engine ever refunds twice."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--json", action="store_true", help="print the rows as JSON")
        parser.add_argument(
            "--timeout", type=float, default=90, help="seconds to wait for each run"
        )
        parser.add_argument("--workdir", default="", help="where logs and failpoint markers go")

    def handle(self, *args, **options) -> None:
        workdir = Path(options["workdir"] or tempfile.mkdtemp(prefix="crashlab-"))
        quiet = options["json"]
        log = (lambda msg: None) if quiet else (lambda msg: self.stderr.write(msg))
        log(f"crash lab: logs in {workdir}")
        rows = run_lab(workdir, timeout=options["timeout"], log=log)
        ok, problems = verdict(rows)
        if quiet:
            self.stdout.write(as_json(rows))
        else:
            self.stdout.write(self._table(rows))
            self.stdout.write("")
            for group, label in (("A", "naive task"), ("B", "durable engine")):
                dupes = [r.fault for r in rows if r.group == group and r.refunds_executed > 1]
                self.stdout.write(
                    f"group {group} ({label}): duplicate refunds at {', '.join(dupes) or 'no fault point'}"
                )
            self.stdout.write(
                "verdict: "
                + (
                    "OK, the engine refunded exactly once everywhere"
                    if ok
                    else "FAILED: " + "; ".join(problems)
                )
            )
        if not ok:
            sys.exit(1)

    def _table(self, rows) -> str:
        def cell(value, width):
            text = str(value)
            return (text[: width - 1] + "…") if len(text) > width else text.ljust(width)

        lines = ["  ".join(cell(HEADERS.get(name, name), w) for name, w in COLUMNS)]
        lines.append("  ".join("-" * w for _, w in COLUMNS))
        for row in rows:
            lines.append("  ".join(cell(getattr(row, name), w) for name, w in COLUMNS))
        return "\n".join(lines)
