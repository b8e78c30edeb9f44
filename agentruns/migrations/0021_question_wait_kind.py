"""A wait of kind `question`: a person answers the model's question in the inbox."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentruns', '0020_journal_and_waits'),
    ]

    operations = [
        migrations.AlterField(
            model_name='wait',
            name='kind',
            field=models.CharField(choices=[('approval', 'Approval'), ('event', 'Event'), ('question', 'Question')], max_length=16),
        ),
    ]
