"""A step whose unknown outcome was aborted in the inbox stays `unknown` (it was `failed`, and a
retry of the failed run ran it again: a second mail). Steps aborted before this change get the
status they would have now, so no door runs them again (runtime/execution/unknown_outcomes.py)."""

from django.db import migrations


def _aborted(apps):
    Approval = apps.get_model("approvals", "Approval")
    return Approval.objects.filter(
        kind="reconciliation", status="resolved", resolution="abort"
    ).values("step_id")


def forwards(apps, schema_editor):
    Step = apps.get_model("agentruns", "Step")
    Step.objects.filter(id__in=_aborted(apps), status="failed").update(status="unknown")


def backwards(apps, schema_editor):
    Step = apps.get_model("agentruns", "Step")
    Step.objects.filter(id__in=_aborted(apps), status="unknown").update(status="failed")


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0006_across_runs"),
        ("agentruns", "0014_run_retry_unknown"),
    ]

    operations = [migrations.RunPython(forwards, backwards)]
