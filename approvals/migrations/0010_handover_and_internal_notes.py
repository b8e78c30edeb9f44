"""Hand-over items (kind `handover`, closed by a `close` decision) and internal notes on an
item and on each decision row (issue 34: staff only, never the agent or the customer)."""


from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0009_decided_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='internal_note',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AddField(
            model_name='approvaldecision',
            name='internal_note',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AlterField(
            model_name='approval',
            name='kind',
            field=models.CharField(choices=[('approval', 'Approval'), ('reconciliation', 'Reconciliation'), ('handover', 'Handover')], default='approval', max_length=16),
        ),
        migrations.AlterField(
            model_name='approvaldecision',
            name='decision',
            field=models.CharField(choices=[('approve', 'Approve'), ('reject', 'Reject'), ('close', 'Close')], max_length=8),
        ),
    ]
