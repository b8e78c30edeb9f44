"""The engine's commit as one PostgreSQL function (agentruns/pgcommit.py); nothing on SQLite."""

from django.db import migrations

from agentruns.runtime import pgcommit


class Migration(migrations.Migration):

    dependencies = [
        ("agentruns", "0004_step_retry_base"),
    ]

    operations = [
        migrations.RunPython(pgcommit.install, pgcommit.uninstall, elidable=False),
    ]
