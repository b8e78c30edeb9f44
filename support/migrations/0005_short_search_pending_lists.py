"""Short pending lists for the desk's trigram indexes (PostgreSQL only, as the indexes are):
`gin_pending_list_limit = 64` kB, the least PostgreSQL allows.

A GIN index gathers new rows in a pending list that every search reads in full, until a VACUUM
or a list over the limit (4 MB by default) moves them into the index: after 50,000 tickets and
orders inserted, the customers' names index held 14,000 of them in that list, and each runs
search by a customer's name read them all first. A short list costs the inserting transaction a
merge now and then, and keeps every search reading a few pages (agentruns 0031 does the same
for the runs' search indexes).
"""

from django.db import migrations

INDEXES = ("ticket_search_trgm_idx", "order_customer_trgm_idx")


def _short_pending_lists(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for index in INDEXES:
        schema_editor.execute(f"ALTER INDEX IF EXISTS {index} SET (gin_pending_list_limit = 64)")


def _default_pending_lists(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for index in INDEXES:
        schema_editor.execute(f"ALTER INDEX IF EXISTS {index} RESET (gin_pending_list_limit)")


class Migration(migrations.Migration):
    dependencies = [
        ("support", "0004_ticket_requests"),
    ]

    operations = [
        migrations.RunPython(_short_pending_lists, _default_pending_lists),
    ]
