"""Two indexes no query used, each paid by every run (issue 22, CPU per step): the btree on
`Run.search_text` (the list searches with istartswith / icontains, served by the trigram index
of 0002) and the varchar_pattern_ops (LIKE) twin that `unique=True` builds next to the unique
index of `Step.idempotency_key` on PostgreSQL; the key stays unique (a named constraint).
Per run of the seven-step flow: 9 fewer index insertions, ~1.2 kB less WAL."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0012_commit_function_keyed_updates"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="run",
            name="run_search_idx",
        ),
        migrations.AlterField(
            model_name="step",
            name="idempotency_key",
            field=models.CharField(max_length=100),
        ),
        migrations.AddConstraint(
            model_name="step",
            constraint=models.UniqueConstraint(
                fields=("idempotency_key",), name="step_unique_idempotency_key"
            ),
        ),
    ]
