"""The runs search's words index, and short pending lists for its GIN indexes (PostgreSQL only;
SQLite has neither and searches by scanning, which the demo's sizes allow).

- `run_search_words_idx`: the words of search_text, upper-cased, as an array (GIN). It answers
  "any of these keys as a whole word" (`selectors.run_list.AnyWord`): the runs of a customer's
  50 orders in one index scan, where the pattern it replaces read every run.
- `gin_pending_list_limit = 64` (kB, the least PostgreSQL allows) on it and on the trigram
  index: a GIN index gathers new rows in a pending list that every search reads in full, until
  a VACUUM or a list over the limit (4 MB by default) moves them into the index. At 10,000 runs
  inserted since the last VACUUM every row was in that list: each trigram search read all of
  them (12-18 ms), and the planner, counting those pages, chose to scan the table instead. A
  short list costs the inserting transaction a merge now and then, and keeps every search
  reading a few pages.
"""

from django.db import migrations

SHORT_PENDING_LIST = "gin_pending_list_limit = 64"


def _words_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "CREATE INDEX IF NOT EXISTS run_search_words_idx ON agentruns_run USING gin "
        r"(regexp_split_to_array(UPPER(search_text::text), '\s+')) "
        f"WITH ({SHORT_PENDING_LIST})"
    )
    schema_editor.execute(f"ALTER INDEX IF EXISTS run_search_trgm_idx SET ({SHORT_PENDING_LIST})")


def _drop_words_index(apps, schema_editor) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("DROP INDEX IF EXISTS run_search_words_idx")
    schema_editor.execute(
        "ALTER INDEX IF EXISTS run_search_trgm_idx RESET (gin_pending_list_limit)"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0030_resume_points"),
    ]

    operations = [
        migrations.RunPython(_words_index, _drop_words_index),
    ]
