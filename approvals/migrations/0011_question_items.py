"""Questions to a colleague: inbox items of kind `question` (the answer and the wait it resolves)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0010_handover_and_internal_notes'),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='answer',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='approval',
            name='wait_token',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
        migrations.AlterField(
            model_name='approval',
            name='kind',
            field=models.CharField(choices=[('approval', 'Approval'), ('reconciliation', 'Reconciliation'), ('handover', 'Handover'), ('question', 'Question')], default='approval', max_length=16),
        ),
        migrations.AlterField(
            model_name='approvaldecision',
            name='decision',
            field=models.CharField(choices=[('approve', 'Approve'), ('reject', 'Reject'), ('close', 'Close'), ('answer', 'Answer')], max_length=8),
        ),
    ]
