"""The engine's commit as one PostgreSQL function (agentruns/runtime/store/pg_function.py); nothing on SQLite."""

from django.db import migrations

from agentruns.runtime.store import pg_function as pgcommit


class Migration(migrations.Migration):

    dependencies = [
        ("agentruns", "0004_step_retry_base"),
    ]

    operations = [
        migrations.RunPython(pgcommit.install, pgcommit.uninstall, elidable=False),
    ]
