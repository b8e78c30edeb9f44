"""Runs get an `outcome` beside their status (issue 34: what the work came to, set when the run
ends by its agent's declaration), with a partial index for the runs list's outcome filter, and
the commit function reinstalled: an engine commit may set it (pg_function.RUN_SET_FIELDS)."""

from django.db import migrations, models

from agentruns.runtime.store import pg_function as pgcommit


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0017_commit_function_in_flight_cap"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="outcome",
            field=models.CharField(blank=True, db_default="", default="", max_length=40),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("outcome", ""), _negated=True),
                fields=["outcome", "-created_at"],
                name="run_outcome_created_idx",
            ),
        ),
        migrations.RunPython(pgcommit.install, migrations.RunPython.noop, elidable=False),
    ]
