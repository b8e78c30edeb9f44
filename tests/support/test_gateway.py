"""The simulated refund gateway validates like a real payment service: its key, a known order,
a positive amount no larger than what was paid, bounded inputs; every refusal is a
JSON 4xx and nothing reaches its ledger."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentruns.models import Run
from agentruns.registry import ToolContext
from agentruns.registry.context import stepping
from support.agents import issue_refund
from support.models import GatewayRefund, Order
from tests.helpers import assert_json_error
from tests.procs import start_web

KEY = "gw-test-key-0123456789"


def post(body: dict | str, key: str = "k-1", auth: str | None = f"Bearer {KEY}", **headers):
    raw = body if isinstance(body, str) else json.dumps(body)
    if auth is not None:
        headers["HTTP_AUTHORIZATION"] = auth
    return Client().post(
        "/gateway/refunds",
        raw,
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY=key,
        **headers,
    )


@pytest.fixture
def keyed(settings, seeded):
    settings.REFUND_GATEWAY_KEY = KEY
    return Order.objects.get(order_id="ORD-1001")


def refused(response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.content)
    assert response["Content-Type"] == "application/json"
    return response.json()["error"]


def test_the_key_is_required_when_set(keyed):
    body = {"order_id": "ORD-1001", "amount_cents": 100, "reason": "x"}
    assert "REFUND_GATEWAY_KEY" in refused(post(body, auth=None), 401)
    refused(post(body, auth="Bearer wrong"), 401)
    refused(post(body, auth=KEY), 401)  # no scheme
    assert GatewayRefund.objects.count() == 0
    assert post(body).status_code == 201
    # the ledger stays readable for the demo
    assert Client().get("/gateway/refunds").json()["refunds"][0]["amount_cents"] == 100


def test_known_orders_and_amounts_up_to_what_was_paid(keyed):
    paid = keyed.amount_cents
    assert "no order" in refused(post({"order_id": "ORD-9999", "amount_cents": 1}), 404)
    assert "more than was paid" in refused(
        post({"order_id": "ORD-1001", "amount_cents": paid + 1}, "k-2"), 422
    )
    assert post({"order_id": "ORD-1001", "amount_cents": paid}, "k-3").status_code == 201
    assert [r.amount_cents for r in GatewayRefund.objects.all()] == [paid]


@pytest.mark.parametrize(
    "body",
    [
        {"order_id": "ORD-1001", "amount_cents": 2**31},
        {"order_id": "ORD-1001", "amount_cents": 2**63 - 1},
        '{"order_id": "ORD-1001", "amount_cents": 18446744073709551616}',
        '{"order_id": "ORD-1001", "amount_cents": 1e999}',
        '{"order_id": "ORD-1001", "amount_cents": NaN}',
        '{"order_id": "ORD-1001", "amount_cents": ' + "9" * 5000 + "}",
        {"order_id": "ORD-1001", "amount_cents": 0},
        {"order_id": "ORD-1001", "amount_cents": 1.5},
        {"order_id": "ORD-1001", "amount_cents": True},
        {"order_id": "ORD-" + "1" * 500, "amount_cents": 1},
        {"order_id": "ORD-1001\u0000", "amount_cents": 1},
        '{"order_id": "ORD-1001\\ud800", "amount_cents": 1}',
        {"order_id": "ORD-1001", "amount_cents": 1, "reason": {"nested": True}},
        "[1, 2]",
    ],
)
def test_hostile_bodies_are_clean_4xx(keyed, body):
    response = post(body, key="k-hostile")
    assert 400 <= response.status_code < 500, response.content
    assert "error" in response.json()
    assert GatewayRefund.objects.count() == 0


def test_hostile_headers_and_queries(keyed):
    body = {"order_id": "ORD-1001", "amount_cents": 1}
    refused(post(body, key="k" * 201), 400)
    refused(post(body, key="bad\tkey"), 400)
    plain = Client().post(
        "/gateway/refunds",
        json.dumps(body),
        content_type="text/plain",
        HTTP_IDEMPOTENCY_KEY="k-plain",
        HTTP_AUTHORIZATION=f"Bearer {KEY}",
    )
    refused(plain, 415)
    assert Client().get("/gateway/refunds", {"order_id": "x" * 5000}).json() == {"refunds": []}
    assert Client().get("/gateway/refunds", {"order_id": "ORD\x00"}).status_code == 400
    assert Client().delete("/gateway/refunds").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_issue_refund_sends_the_key(tmp_path, settings, seeded):
    web, url = start_web(tmp_path, REFUND_GATEWAY_KEY=KEY)
    try:
        settings.REFUND_GATEWAY_URL = url + "/gateway"
        run = Run.objects.create(agent="refund", input={})
        context = ToolContext(run=run, step=None, attempt=1, idempotency_key="step-key-1")

        def refund(context: ToolContext, **arguments) -> dict:
            with stepping(context):  # the call's step, as the engine's tool unit makes it
                return issue_refund(**arguments)

        settings.REFUND_GATEWAY_KEY = ""  # a tool without the key is refused ...
        with pytest.raises(Exception, match="401"):
            refund(context, order_id="ORD-1002", ticket_id="T-1002", amount_cents=500, reason="r")
        settings.REFUND_GATEWAY_KEY = KEY  # ... and with it, refunds
        done = refund(
            context, order_id="ORD-1002", ticket_id="T-1002", amount_cents=500, reason="r"
        )
        assert done["amount_cents"] == 500
        assert GatewayRefund.objects.get().idempotency_key == "step-key-1"
    finally:
        web.kill()


# ------------------------------------------------------------------ the Idempotency-Key ledger
def gateway_post(client: Client, body: dict | str, key: str | None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    raw = body if isinstance(body, str) else json.dumps(body)
    return client.post("/gateway/refunds", raw, content_type="application/json", **headers)


@pytest.mark.django_db
def test_gateway_requires_an_idempotency_key(client: Client):
    body = {"order_id": "ORD-1001", "amount_cents": 1500, "reason": "broken"}
    assert_json_error(gateway_post(client, body, None), 400)
    assert_json_error(gateway_post(client, body, "   "), 400)
    assert GatewayRefund.objects.count() == 0


@pytest.mark.django_db
def test_gateway_rejects_bad_bodies(client: Client):
    assert_json_error(gateway_post(client, "{not json", "k-1"), 400)
    assert_json_error(gateway_post(client, "[1, 2]", "k-2"), 400)
    assert_json_error(gateway_post(client, {"amount_cents": 5}, "k-3"), 400)
    assert_json_error(gateway_post(client, {"order_id": "ORD-1", "amount_cents": -5}, "k-4"), 400)
    assert_json_error(gateway_post(client, {"order_id": "ORD-1", "amount_cents": "5"}, "k-5"), 400)
    assert GatewayRefund.objects.count() == 0


@pytest.mark.django_db
def test_gateway_repeated_key_returns_the_same_body_and_one_row(client: Client, seeded):
    # the gateway refunds only orders it knows (seed_demo's)
    body = {"order_id": "ORD-1001", "amount_cents": 1500, "reason": "broken"}
    first = gateway_post(client, body, "step-abc")
    again = gateway_post(client, body, "step-abc")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == first.json()
    assert first.json()["idempotency_key"] == "step-abc" and first.json()["amount_cents"] == 1500
    assert GatewayRefund.objects.filter(idempotency_key="step-abc").count() == 1
    # the same key with other parameters is refused, not executed
    assert_json_error(gateway_post(client, {**body, "amount_cents": 9999}, "step-abc"), 422)
    assert GatewayRefund.objects.count() == 1


@pytest.mark.django_db
def test_gateway_get_lists_what_it_executed(client: Client, seeded):
    gateway_post(client, {"order_id": "ORD-1001", "amount_cents": 1500, "reason": "a"}, "k-a")
    gateway_post(client, {"order_id": "ORD-1002", "amount_cents": 2500, "reason": "b"}, "k-b")
    gateway_post(client, {"order_id": "ORD-1001", "amount_cents": 500, "reason": "c"}, "k-c")
    listed = client.get("/gateway/refunds").json()["refunds"]
    assert [(r["order_id"], r["amount_cents"], r["idempotency_key"]) for r in listed] == [
        ("ORD-1001", 1500, "k-a"),
        ("ORD-1002", 2500, "k-b"),
        ("ORD-1001", 500, "k-c"),
    ]
    assert all(
        {"id", "order_id", "amount_cents", "idempotency_key", "created_at"} <= set(r)
        for r in listed
    )
    only = client.get("/gateway/refunds?order_id=ORD-1001").json()["refunds"]
    assert [r["idempotency_key"] for r in only] == ["k-a", "k-c"]
    assert client.get("/gateway/refunds?order_id=ORD-9999").json() == {"refunds": []}
