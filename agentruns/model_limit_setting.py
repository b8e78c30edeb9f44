"""The value of AGENTRUNS_MODEL_LIMITS, parsed and typed (read in `agentruns/conf.py`; kept by
`runtime/access/model_limits.py`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class ModelLimit:
    """A model provider's rate limit for one model name (runtime/access/model_limits.py)."""

    rpm: int = 0  # requests a minute (0: not limited)
    tpm: int = 0  # tokens a minute (0: not limited)


def parse_model_limits(name: str, raw: Any) -> dict[str, ModelLimit]:
    """`{"<model name>": {"rpm": 60, "tpm": 90000}, ...}` (JSON, or that dict in a settings
    module) -> {model name: ModelLimit}; anything else is ImproperlyConfigured, naming it."""
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            f'{name} must be a JSON object: {{"<model name>": {{"rpm": 60, "tpm": 90000}}}}'
        )
    limits: dict[str, ModelLimit] = {}
    for model, limit in raw.items():
        where = f"{name}[{model!r}]"
        if not isinstance(model, str) or not model.strip():
            raise ImproperlyConfigured(f"{name}: a model name must be a non-empty string")
        if not isinstance(limit, dict) or not limit:
            raise ImproperlyConfigured(f'{where} must be an object like {{"rpm": 60}}')
        unknown = sorted(set(limit) - {"rpm", "tpm"})
        if unknown:
            raise ImproperlyConfigured(f"{where}: unknown key(s) {unknown}; use rpm and tpm")
        for key, value in limit.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ImproperlyConfigured(f"{where}.{key}={value!r} is not a positive integer")
        limits[model] = ModelLimit(**limit)
    return limits
