"""`manage.py purge_runs --older-than 90d [--dry-run]`: delete finished runs (succeeded, failed,
cancelled) that finished longer ago than that, with their steps, attempts, events and inbox
items, in batches; never a queued, running or waiting run (agentruns/runtime/retention.py)."""

from __future__ import annotations

import re
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentruns.runtime import retention

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhm])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def parse_age(text: str) -> timedelta:
    """`90d`, `12h`, `30m` (a number and a unit: days, hours, minutes); CommandError otherwise."""
    match = _AGE.match(text or "")
    if not match:
        raise CommandError(
            f"--older-than {text!r}: give a number and a unit, d (days), h (hours) or m "
            "(minutes), e.g. 90d"
        )
    try:
        age = timedelta(**{_UNITS[match[2]]: float(match[1])})
    except OverflowError:
        raise CommandError(f"--older-than {text!r} is too large") from None
    if age <= timedelta(0):
        raise CommandError(f"--older-than {text!r} must be more than nothing")
    return age


class Command(BaseCommand):
    help = (
        "Delete finished runs older than --older-than, with their steps, attempts, events and "
        "inbox items, in batches; queued, running and waiting runs are never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="finished longer ago than this: 90d, 12h, 30m",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted, delete nothing"
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=retention.BATCH,
            help=f"runs per transaction (default {retention.BATCH})",
        )

    def handle(self, *args, **options) -> None:
        age = parse_age(options["older_than"])
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        dry_run = options["dry_run"]
        counts = retention.purge(age, dry_run=dry_run, batch=options["batch"])
        runs = counts.get(retention.RUNS_TABLE, 0)
        verb = "would delete (dry run, nothing deleted)" if dry_run else "deleted"
        self.stdout.write(f"{verb}: {runs} finished run(s) older than {options['older_than']}")
        for line in retention.report(counts):
            self.stdout.write(f"  {line}")
