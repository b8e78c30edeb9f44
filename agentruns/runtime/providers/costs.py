"""Model cost by the price table AGENTRUNS_MODEL_PRICES."""

from __future__ import annotations

import logging
from decimal import Decimal, InvalidOperation
from functools import lru_cache

from agentruns.conf import conf
from agentruns.runtime.providers import Usage

log = logging.getLogger(__name__)


@lru_cache(maxsize=8)
def parse_model_prices(spec: str) -> dict[str, tuple[Decimal, Decimal]]:
    """AGENTRUNS_MODEL_PRICES "gpt-4o-mini=0.15/0.60,..." -> {model: (prompt, completion) USD
    per million tokens}. A malformed entry is skipped with a warning, never a failed run."""
    prices: dict[str, tuple[Decimal, Decimal]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, pair = item.partition("=")
        prompt, _, completion = pair.partition("/")
        try:
            prices[name.strip()] = (
                Decimal(prompt.strip()),
                Decimal((completion or prompt).strip()),
            )
        except InvalidOperation:
            log.warning("AGENTRUNS_MODEL_PRICES: ignoring malformed entry %r", item)
    return prices


def model_cost_usd(model: str, usage: Usage) -> Decimal:
    """What a model step cost by the price table; "openai/gpt-4o" (or the Pydantic AI name
    "openai:gpt-4o") matches "openai/gpt-4o" or "gpt-4o". Unpriced models cost 0."""
    prices = parse_model_prices(conf.MODEL_PRICES or "")
    bare = model.split("/", 1)[-1].split(":", 1)[-1]
    price = prices.get(model) or prices.get(bare)
    if price is None:
        return Decimal(0)
    cost = (usage.prompt_tokens * price[0] + usage.completion_tokens * price[1]) / Decimal(
        1_000_000
    )
    return cost.quantize(Decimal("0.000001"))
