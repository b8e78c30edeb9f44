from django.db import migrations, models


class Migration(migrations.Migration):
    """Threads made before this one keep what they did then (a parked turn kept the thread):
    they are marked `chat` by the column's first default, new ones are not unless the chat
    endpoint makes them."""

    dependencies = [
        ("agentruns", "0024_run_thread"),
    ]

    operations = [
        migrations.AddField(
            model_name="thread",
            name="chat",
            field=models.BooleanField(default=True),
        ),
        migrations.AlterField(
            model_name="thread",
            name="chat",
            field=models.BooleanField(default=False),
        ),
    ]
