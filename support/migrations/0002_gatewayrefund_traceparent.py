from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("support", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="gatewayrefund",
            name="traceparent",
            field=models.CharField(blank=True, db_default="", default="", max_length=55),
        ),
    ]
