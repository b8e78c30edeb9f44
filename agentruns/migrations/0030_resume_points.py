from django.db import migrations, models
import django.db.models.deletion


class Migration(migrations.Migration):

    dependencies = [
        ("agentruns", "0029_set_priority_permission"),
    ]

    operations = [
        migrations.CreateModel(
            name="ResumePoint",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="resume_point",
                        serialize=False,
                        to="agentruns.run",
                    ),
                ),
                ("model_step", models.UUIDField()),
                ("models_seen", models.PositiveIntegerField()),
                ("entries_seen", models.PositiveIntegerField()),
                ("waits_seen", models.PositiveIntegerField()),
                ("run_step", models.PositiveIntegerField(default=0)),
                ("thread_turn", models.BooleanField(default=False)),
                ("messages", models.TextField()),
                ("usage", models.JSONField(default=dict)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
        ),
    ]
