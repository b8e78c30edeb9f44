"""The commit function checks a start's in-flight cap under a lock per user (issue 31: a count
followed by an insert let 10 of 60 concurrent starts through a cap of 5); nothing on SQLite."""

from django.db import migrations

from agentruns.runtime.store import pg_function as pgcommit


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0016_concurrency_keys_and_priority"),
    ]

    operations = [
        migrations.RunPython(pgcommit.install, migrations.RunPython.noop, elidable=False),
    ]
