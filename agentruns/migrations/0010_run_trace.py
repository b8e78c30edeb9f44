from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("agentruns", "0009_quota_bucket"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="trace_id",
            field=models.CharField(blank=True, db_default="", default="", max_length=32),
        ),
        migrations.AddField(
            model_name="run",
            name="trace_parent",
            field=models.CharField(blank=True, db_default="", default="", max_length=55),
        ),
        migrations.AddField(
            model_name="workerheartbeat",
            name="process_health",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
