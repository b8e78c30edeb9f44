"""The refund policy reads the amount a customer names, and nothing that only looks like one."""

from __future__ import annotations

import pytest

from support.policy import requested_amount_cents


@pytest.mark.parametrize(
    ("message", "cents"),
    [
        ("Please refund $15 for the scratch.", 1500),
        ("please refund $ 15.50", 1550),
        ("refund 10 USD please", 1000),
        ("refund 10usd please", 1000),
        ("USD 12.30 would be fair", 1230),
        ("I'd like 10.00 back", 1000),
        ("10,50 € zurück bitte", 1050),
        ("€10,50 zurück", 1050),
        ("a refund of 25 dollars", 2500),
        ("just refund 12 and we are good", 1200),
        ("refund me 7", 700),
        ("I paid $1,250.00 but want $1,000.50 back", 125000),  # the first amount named
        ("£20", 2000),
        ("order ORD-1001: refund 10.00", 1000),
        ("ORD-1001 arrived broken on 2024-05-01, refund $12", 1200),
    ],
)
def test_amounts_with_or_without_a_currency_sign(message: str, cents: int):
    assert requested_amount_cents(message) == cents


@pytest.mark.parametrize(
    "message",
    [
        "",
        "The blender arrived broken, please refund it.",
        "Order ORD-1001 arrived broken",
        "order #1042 is missing",
        "It arrived on 2024-05-01",
        "delivered 05/01/2024, broken",
        "delivered 1.5.24, broken",
        "it came at 10:30 and was smashed",
        "the 3rd parcel was empty",
        "I ordered 2 lamps in 2023",
        "refund ORD-1003 please",
        "ticket T-ORD-1001 is open",
        "box of 500ml bottles leaked",
    ],
)
def test_never_an_order_number_or_a_date(message: str):
    assert requested_amount_cents(message) is None
