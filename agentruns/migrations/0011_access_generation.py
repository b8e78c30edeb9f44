"""The access generation (`AccessGeneration`): one row, and the triggers that give it a fresh
random value on every write to what decides a user's permissions (runtime/access/cache.py).

PostgreSQL: one statement-level trigger per table (INSERT, UPDATE, DELETE, TRUNCATE); SQLite: a
row-level trigger per table and kind. A bump recreates a missing row (a flushed table).
"""

from django.conf import settings
from django.db import migrations, models

PG_FUNCTION = "agentruns_bump_access_generation"


def _watched_tables(apps) -> list[str]:
    """Group membership, user and group permissions, groups, permissions, content types (a
    permission's name), tool policies and their rules."""
    user = apps.get_model(settings.AUTH_USER_MODEL)
    group = apps.get_model("auth", "Group")
    return [
        user._meta.get_field("groups").remote_field.through._meta.db_table,
        user._meta.get_field("user_permissions").remote_field.through._meta.db_table,
        group._meta.db_table,
        group._meta.get_field("permissions").remote_field.through._meta.db_table,
        apps.get_model("auth", "Permission")._meta.db_table,
        apps.get_model("contenttypes", "ContentType")._meta.db_table,
        apps.get_model("agentruns", "ToolPolicy")._meta.db_table,
        apps.get_model("agentruns", "ToolRule")._meta.db_table,
    ]


def install(apps, schema_editor) -> None:
    table = apps.get_model("agentruns", "AccessGeneration")._meta.db_table
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        run(
            f"CREATE OR REPLACE FUNCTION {PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN INSERT INTO {table} (id, value) "
            "VALUES (1, floor(random() * 9007199254740991)::bigint) "
            "ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value; RETURN NULL; END $$"
        )
        for watched in _watched_tables(apps):
            run(
                f"CREATE TRIGGER {watched}_access_generation AFTER INSERT OR UPDATE OR DELETE "
                f"OR TRUNCATE ON {watched} FOR EACH STATEMENT EXECUTE FUNCTION {PG_FUNCTION}()"
            )
    elif schema_editor.connection.vendor == "sqlite":
        for watched in _watched_tables(apps):
            for kind in ("INSERT", "UPDATE", "DELETE"):
                # no conflict clause: the firing statement's own (Django's m2m add is an
                # INSERT OR IGNORE) would override it and skip the bump
                run(
                    f"CREATE TRIGGER {watched}_access_generation_{kind.lower()} AFTER {kind} "
                    f"ON {watched} BEGIN UPDATE {table} SET value = random() WHERE id = 1; "
                    f"INSERT INTO {table} (id, value) SELECT 1, random() "
                    f"WHERE NOT EXISTS (SELECT 1 FROM {table} WHERE id = 1); END"
                )
    else:  # no triggers: the cache stays off (a NULL generation is never cached)
        return
    run(f"INSERT INTO {table} (id, value) VALUES (1, 0)")


def uninstall(apps, schema_editor) -> None:
    run = schema_editor.execute
    if schema_editor.connection.vendor == "postgresql":
        for watched in _watched_tables(apps):
            run(f"DROP TRIGGER IF EXISTS {watched}_access_generation ON {watched}")
        run(f"DROP FUNCTION IF EXISTS {PG_FUNCTION}()")
    elif schema_editor.connection.vendor == "sqlite":
        for watched in _watched_tables(apps):
            for kind in ("insert", "update", "delete"):
                run(f"DROP TRIGGER IF EXISTS {watched}_access_generation_{kind}")


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0010_run_trace"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="AccessGeneration",
            fields=[
                ("id", models.PositiveSmallIntegerField(primary_key=True, serialize=False)),
                ("value", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(install, uninstall, elidable=False),
    ]
