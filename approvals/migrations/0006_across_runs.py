"""Across runs (issue 30): an item's operation key (the card's cross-run context: the other
pending items of the same key) and the amount each approval approved (an approver's total per
day, AGENTRUNS_APPROVER_DAILY_LIMIT_CENTS)."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentruns', '0015_operation_keys'),
        ('approvals', '0005_approval_version'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='operation_key',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='approvaldecision',
            name='amount',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(condition=models.Q(('status', 'pending'), models.Q(('operation_key', ''), _negated=True)), fields=['operation_key'], name='approval_pending_key_idx'),
        ),
        migrations.AddIndex(
            model_name='approvaldecision',
            index=models.Index(condition=models.Q(('decision', 'approve')), fields=['user', 'decided_at'], name='decision_user_day_idx'),
        ),
    ]
