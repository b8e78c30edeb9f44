"""The one formatter of amounts in minor units (inbox cards, mails, admin, limits, the demo)."""

from __future__ import annotations

import pytest

from agentruns.runtime.values.money import format_cents


@pytest.mark.parametrize(
    "cents, currency, shown",
    [
        (459900, "", "4,599.00"),
        (4599, "EUR", "45.99 EUR"),
        (5, "", "0.05"),
        (0, "", "0.00"),
        (-1250, "USD", "-12.50 USD"),
        (2500.0, "", "25.00"),  # a float amount (an approver limit check sees those)
        # exact: a float division would print 90,071,992,547,409.92 and overflow past 10**308
        (9_007_199_254_740_993, "", "90,071,992,547,409.93"),
        (10**400, "", f"{10**398:,}.00"),
    ],
)
def test_format_cents(cents, currency, shown):
    assert format_cents(cents, currency) == shown
