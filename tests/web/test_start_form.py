"""The start form (issue 34, item 1): the agent's input as fields from its `input_schema`
(strings, integers, numbers, booleans, enums; required marks; the schema's bounds), raw JSON as
the advanced option, one run per rendered form however often it is sent."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from agentruns.models import Run
from agentruns.registry import Agent, register_agent
from agentruns.web.forms.inputs import input_fields, input_from_form
from tests.helpers import make_user
from tests.testkit import script_policy

pytestmark = pytest.mark.django_db

START = ["agentruns.start_run", "agentruns.view_run"]
TYPED_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "minLength": 2, "maxLength": 40},
        "note": {"type": "string"},
        "count": {"type": "integer", "minimum": 1, "maximum": 9},
        "ratio": {"type": ["number", "null"]},
        "urgent": {"type": "boolean"},
        "tier": {"enum": ["gold", "silver", 3]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["count", "customer"],
    "additionalProperties": False,
}
register_agent(
    Agent(
        name="typed-form",
        instructions="-",
        tools=[],
        scripted_policy=script_policy,
        input_schema=TYPED_SCHEMA,
    )
)


@pytest.fixture
def client(django_user_model) -> Client:
    client = Client()
    client.force_login(make_user(django_user_model, "starter", START))
    return client


def token_of(html: str) -> str:
    return re.search(r'name="form_token" value="([^"]+)"', html).group(1)


def test_fields_follow_the_schema():
    fields = {f.name: f for f in input_fields(TYPED_SCHEMA)}
    assert list(fields)[:2] == ["customer", "count"]  # required first, in schema order
    assert fields["customer"].kind == "text" and fields["customer"].required
    assert fields["customer"].attrs == {"maxlength": 40, "minlength": 2}
    assert fields["note"].kind == "textarea"  # unbounded text
    assert fields["count"].kind == "integer" and fields["count"].attrs == {
        "step": "1",
        "min": 1,
        "max": 9,
    }
    assert fields["ratio"].kind == "number" and fields["urgent"].kind == "boolean"
    assert fields["tier"].kind == "choice" and fields["tier"].choices == ["gold", "silver", "3"]
    assert fields["tags"].kind == "json"
    posted = {
        "in_customer": " Ada ",
        "in_count": "3",
        "in_ratio": "0.5",
        "in_urgent": "true",
        "in_tier": "3",
        "in_tags": '["a", "b"]',
        "in_note": "",
    }
    assert input_from_form(TYPED_SCHEMA, posted) == {
        "customer": "Ada",
        "count": 3,
        "ratio": 0.5,
        "urgent": True,
        "tier": 3,  # the enum's own value, not its text
        "tags": ["a", "b"],
    }
    for bad, message in (
        ({"in_customer": "Al", "in_count": "3.5"}, "count: a whole number"),
        ({"in_count": "1", "in_customer": ""}, "customer is required"),
        ({"in_count": "1", "in_customer": "Al", "in_ratio": "nan"}, "ratio: a finite number"),
        ({"in_count": "1", "in_customer": "Al", "in_tier": "bronze"}, "tier: one of"),
        ({"in_count": "1", "in_customer": "Al", "in_tags": "[oops"}, "tags: not valid JSON"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            input_from_form(TYPED_SCHEMA, bad)


def test_the_refund_form_starts_a_run_without_json(client, seeded):
    page = client.get("/runs/new/", {"agent": "refund"}).content.decode()
    # the demo agent's fields: order_id required (marked, bounded), message a text area
    assert re.search(
        r'<input id="f-order_id" name="in_order_id" value="" maxlength="20" '
        r'minlength="1" aria-required="true">',
        page,
    )
    assert '<textarea id="f-message" name="in_message" rows="4" maxlength="5000">' in page
    assert 'name="in_ticket_id"' in page and "up to 5000 characters" in page
    assert '<details class="advanced">' in page  # JSON: one click away, closed
    form = {
        "agent": "refund",
        "form_token": token_of(page),
        "in_order_id": "ORD-1009",
        "in_message": "The lamp arrived broken, refund $12",
        "in_ticket_id": "",
        "input": "",
    }
    response = client.post("/runs/new/", form)
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.id}/"
    assert run.input == {"order_id": "ORD-1009", "message": "The lamp arrived broken, refund $12"}
    # the same form again (a double click): the same run
    assert client.post("/runs/new/", form)["Location"] == f"/runs/{run.id}/"
    assert Run.objects.count() == 1
    # a required field left empty: the form again, with the message and what was typed
    refused = client.post("/runs/new/", {**form, "form_token": token_of(page), "in_order_id": ""})
    assert refused.status_code == 400
    body = refused.content.decode()
    assert "order_id is required" in body and "The lamp arrived broken" in body


def test_json_stays_as_the_advanced_option(client, seeded):
    form = {
        "agent": "refund",
        "input": json.dumps({"order_id": "ORD-1010", "message": "by hand"}),
        "in_order_id": "ORD-9999",  # the JSON, when given, replaces the fields
    }
    assert client.post("/runs/new/", form).status_code == 302
    assert Run.objects.get().input == {"order_id": "ORD-1010", "message": "by hand"}
    refused = client.post("/runs/new/", {"agent": "refund", "input": '{"order_id": 5}'})
    assert refused.status_code == 400 and "is not of type" in refused.content.decode()
    assert '<details class="advanced" open>' in refused.content.decode()


def test_switching_agents_renders_their_fields(client):
    fields = client.get("/runs/new/", {"agent": "typed-form"}, HTTP_HX_REQUEST="true")
    html = fields.content.decode()
    assert "{%" not in html and 'id="input-fields"' in html
    assert 'type="number"' in html and 'type="checkbox" name="in_urgent"' in html
    assert '<option value="">—</option><option >gold</option>' in html.replace("\n", "")
    # an agent without a schema: JSON only, open (an empty form is an empty input)
    no_schema = client.get("/runs/new/", {"agent": "script"}, HTTP_HX_REQUEST="true")
    assert "declares no input fields" in no_schema.content.decode()
    assert '<details class="advanced" open>' in no_schema.content.decode()
    assert client.post("/runs/new/", {"agent": "script", "input": ""}).status_code == 302
    assert Run.objects.get().input == {}
    Run.objects.all().delete()
    response = client.post(
        "/runs/new/",
        {"agent": "typed-form", "in_customer": "Bo", "in_count": "2", "in_tier": "gold"},
    )
    assert response.status_code == 302
    assert Run.objects.get().input == {
        "customer": "Bo",
        "count": 2,
        "urgent": False,
        "tier": "gold",
    }
