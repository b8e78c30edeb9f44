"""API tokens expire (default 90 days after creation) and record when they were revoked.

Tokens made before this migration get the same 90 days from their creation: none of them is
suddenly valid forever, and none is cut off without the usual notice period.
"""

from datetime import timedelta

from django.db import migrations, models
from django.db.models import F


def expire_existing(apps, schema_editor):
    ApiToken = apps.get_model("agentruns", "ApiToken")
    ApiToken.objects.filter(expires_at__isnull=True).update(
        expires_at=F("created_at") + timedelta(days=90)
    )


class Migration(migrations.Migration):
    dependencies = [("agentruns", "0006_permissions_and_tool_policies")]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="revoked_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(expire_existing, migrations.RunPython.noop),
    ]
