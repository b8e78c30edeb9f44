"""The commit function reinstalled: a start alone in its transaction takes the per-user in-flight
lock shared, far below its cap (agentruns/runtime/store/pg_function.py)."""

from django.db import migrations

from agentruns.runtime.store import pg_function as pgcommit


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0031_run_search_words"),
    ]

    operations = [
        migrations.RunPython(pgcommit.install, migrations.RunPython.noop, elidable=False),
    ]
