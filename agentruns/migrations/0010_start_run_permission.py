"""`agentruns.start_run` (DESIGN.md 6: starting a run needs it), declared on Run so Django's
post-migrate hook creates it (and re-creates it after a flush, as tests do).

Options only: no schema change. Where another change already declares the same permission,
this is a no-op for the database; re-parent it after that change's migration when merging.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0005_commit_function"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="run",
            options={
                "permissions": [
                    ("operate_run", "Can retry, cancel and resolve runs"),
                    ("start_run", "Can start runs"),
                ]
            },
        ),
    ]
