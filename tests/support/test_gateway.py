"""The simulated refund gateway's own endpoint (support/gateway.py): an Idempotency-Key ledger
with JSON errors."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from support.models import GatewayRefund
from tests.helpers import assert_json_error

pytestmark = pytest.mark.django_db


def gateway_post(client: Client, body: dict | str, key: str | None):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
    raw = body if isinstance(body, str) else json.dumps(body)
    return client.post("/gateway/refunds", raw, content_type="application/json", **headers)


def test_gateway_requires_an_idempotency_key(client: Client):
    body = {"order_id": "ORD-1001", "amount_cents": 1500, "reason": "broken"}
    assert_json_error(gateway_post(client, body, None), 400)
    assert_json_error(gateway_post(client, body, "   "), 400)
    assert GatewayRefund.objects.count() == 0


def test_gateway_rejects_bad_bodies(client: Client):
    assert_json_error(gateway_post(client, "{not json", "k-1"), 400)
    assert_json_error(gateway_post(client, "[1, 2]", "k-2"), 400)
    assert_json_error(gateway_post(client, {"amount_cents": 5}, "k-3"), 400)
    assert_json_error(gateway_post(client, {"order_id": "ORD-1", "amount_cents": -5}, "k-4"), 400)
    assert_json_error(gateway_post(client, {"order_id": "ORD-1", "amount_cents": "5"}, "k-5"), 400)
    assert GatewayRefund.objects.count() == 0


def test_gateway_repeated_key_returns_the_same_body_and_one_row(client: Client):
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


def test_gateway_get_lists_what_it_executed(client: Client):
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
