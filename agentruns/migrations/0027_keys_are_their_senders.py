# Keys are their senders' (issue 46): a run's Idempotency-Key is unique per agent and starter,
# not per agent (another user's same key is their own run), and the thread `POST /api/runs`
# makes for `"thread": true` has a random id, found again through `ThreadKey`.

import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models.functions import Cast

# the namespace of the thread ids `"thread": true` used to derive (uuid5 of "<user pk>:<agent>:
# <key>", predictable by anyone who knew the user's pk and key): only to find those threads
LEGACY_THREAD_KEY_NAMESPACE = uuid.UUID("6f1d5c52-3f0e-4f55-9d3c-2a7c4b8e9a10")


def owners_of_keys(apps, schema_editor):
    """Each keyed run's key is its starter's (a run whose starter is gone keeps the system's)."""
    Run = apps.get_model("agentruns", "Run")
    Run.objects.filter(dedupe_key__isnull=False, created_by__isnull=False).update(
        dedupe_owner=Cast("created_by_id", models.CharField())
    )


def keys_of_threads(apps, schema_editor):
    """A thread made by `"thread": true` with a key, at the id derived from its maker's pk, agent
    and key, is remembered as that user's (a repeat of the key finds it). A thread someone else
    made at an id derived for another user (a pre-empted id) is nobody's key: the user the id
    was derived for gets a thread of their own."""
    ThreadTurn = apps.get_model("agentruns", "ThreadTurn")
    ThreadKey = apps.get_model("agentruns", "ThreadKey")
    keyed = ThreadTurn.objects.filter(
        client_id__isnull=False, thread__created_by__isnull=False
    ).values_list("thread_id", "thread__created_by_id", "thread__agent", "client_id", "user_id")
    rows = []
    for thread_id, maker, agent, key, sender in keyed.iterator():
        if sender != maker:
            continue
        derived = str(uuid.uuid5(LEGACY_THREAD_KEY_NAMESPACE, f"{maker}:{agent}:{key}"))
        if derived == thread_id:
            rows.append(ThreadKey(user_id=maker, agent=agent, key=key, thread_id=thread_id))
    ThreadKey.objects.bulk_create(rows, batch_size=500, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0026_hook_receipts"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="dedupe_owner",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        # unique per (agent, key) implies unique per (agent, owner, key): added first, it holds
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(("dedupe_key__isnull", False)),
                fields=("agent", "dedupe_owner", "dedupe_key"),
                name="run_unique_owner_dedupe_key",
            ),
        ),
        migrations.RemoveConstraint(
            model_name="run",
            name="run_unique_agent_dedupe_key",
        ),
        migrations.CreateModel(
            name="ThreadKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("agent", models.CharField(max_length=100)),
                ("key", models.CharField(max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "thread",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="agentruns.thread",
                    ),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("user", "agent", "key"), name="threadkey_unique_key"
                    )
                ],
            },
        ),
        migrations.RunPython(owners_of_keys, migrations.RunPython.noop, elidable=True),
        migrations.RunPython(keys_of_threads, migrations.RunPython.noop, elidable=True),
    ]
