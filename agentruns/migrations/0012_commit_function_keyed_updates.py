"""The commit function's step and attempt updates by key, a row at a time (issue 22: the
set-based join's generic plan scanned the whole tables); nothing on SQLite."""

from django.db import migrations

from agentruns.runtime.store import pg_function as pgcommit


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0011_access_generation"),
    ]

    operations = [
        migrations.RunPython(pgcommit.install, migrations.RunPython.noop, elidable=False),
    ]
