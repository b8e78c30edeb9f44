"""The admin: list pages with their filters and read-only detail pages for the runtime tables."""

from __future__ import annotations

import pytest
from django.urls import reverse

from agentruns.models import Run, RunEvent, Step, StepAttempt
from tests import testkit
from tests.helpers import advance, script_run
from tests.testkit import OPS_AGENT

pytestmark = pytest.mark.django_db


@pytest.fixture
def history():
    testkit.FAILS["t_charge"] = 1
    return advance(
        script_run(
            [
                {
                    "calls": [
                        ["ops_lookup", {"customer": "bo", "api_key": "hunter2-bo"}],
                        ["t_charge", {"amount": 2}],
                    ]
                },
                {"text": "ok"},
            ],
            agent=OPS_AGENT,
        )
    )


@pytest.mark.parametrize(
    "model, query",
    [
        (Run, "?status__exact=succeeded"),
        (Run, "?attention=failed"),
        (Run, "?q=ORD"),
        (Step, "?status__exact=succeeded&kind__exact=tool"),
        (StepAttempt, "?outcome__exact=retrying"),
        (RunEvent, "?type__exact=run.status"),
    ],
)
def test_changelists_and_filters(admin_client, history, model, query):
    url = reverse(f"admin:agentruns_{model._meta.model_name}_changelist") + query
    response = admin_client.get(url)
    assert response.status_code == 200


def test_detail_pages_are_read_only_and_redacted(admin_client, history):
    step = Step.objects.get(run=history, tool="ops_lookup")
    for obj in (
        history,
        step,
        step.attempt_rows.first(),
        RunEvent.objects.filter(run=history).first(),
    ):
        url = reverse(f"admin:agentruns_{obj._meta.model_name}_change", args=[obj.pk])
        response = admin_client.get(url)
        assert response.status_code == 200
        page = response.content.decode()
        assert 'name="_save"' not in page  # a view, not a form
    step_page = admin_client.get(
        reverse("admin:agentruns_step_change", args=[step.pk])
    ).content.decode()
    assert "hunter2-bo" not in step_page and "bo@example.com" not in step_page
    assert admin_client.get(reverse("admin:agentruns_run_add")).status_code == 403
    delete = reverse("admin:agentruns_run_delete", args=[history.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert Run.objects.filter(pk=history.pk).exists()
