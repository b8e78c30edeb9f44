"""Operation keys across runs (issue 30): one row per execution of a key, at most one live per
slot, one held per key and one live per step (partial unique constraints), and the leads'
allowances of one more execution."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentruns', '0014_run_retry_unknown'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='OperationExecution',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('slot', models.PositiveIntegerField()),
                ('state', models.CharField(choices=[('held', 'Held'), ('done', 'Done'), ('released', 'Released')], max_length=16)),
                ('run_id', models.UUIDField()),
                ('step_id', models.UUIDField()),
                ('tool', models.CharField(max_length=100)),
                ('result', models.JSONField(blank=True, null=True)),
                ('waiters', models.JSONField(blank=True, default=list)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('settled_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'ordering': ['key', 'slot', 'id'],
                'indexes': [models.Index(condition=models.Q(('state', 'held')), fields=['run_id'], name='operation_held_run_idx')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('state', 'released'), _negated=True), fields=('key', 'slot'), name='operation_one_execution_per_slot'), models.UniqueConstraint(condition=models.Q(('state', 'held')), fields=('key',), name='operation_one_held_per_key'), models.UniqueConstraint(condition=models.Q(('state', 'released'), _negated=True), fields=('step_id',), name='operation_one_live_per_step')],
            },
        ),
        migrations.CreateModel(
            name='OperationAllowance',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('slot', models.PositiveIntegerField()),
                ('granted_by_name', models.CharField(blank=True, default='', max_length=150)),
                ('reason', models.TextField(blank=True, default='')),
                ('run_id', models.UUIDField(blank=True, null=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('granted_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['key', 'slot'],
                'constraints': [models.UniqueConstraint(fields=('key', 'slot'), name='operation_one_allowance_per_slot')],
            },
        ),
    ]
