"""The permission `agentruns.start_run` (DESIGN.md 6: starting a run needs it), if missing.

A no-op where it already exists (another change may declare it in `Run.Meta.permissions`, whose
post-migrate hook then finds it in place); never removed on the way back, for the same reason.
"""

from django.db import migrations


def create_start_run_permission(apps, schema_editor) -> None:
    content_types = apps.get_model("contenttypes", "ContentType")
    permissions = apps.get_model("auth", "Permission")
    run_type, _ = content_types.objects.get_or_create(app_label="agentruns", model="run")
    permissions.objects.get_or_create(
        content_type=run_type, codename="start_run", defaults={"name": "Can start runs"}
    )


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0005_commit_function"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(create_start_run_permission, migrations.RunPython.noop),
    ]
