"""System checks Django's own `check --deploy` lacks for this app."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=True)
def check_secret_key(app_configs: Any, **kwargs: Any) -> list[Error]:
    """Django's W009 accepts our built-in development key (it is long and varied): refuse it."""
    builtin = getattr(settings, "BUILTIN_SECRET_KEY", None)
    if builtin and settings.SECRET_KEY == builtin:
        return [
            Error(
                "SECRET_KEY is the built-in development key, which is public.",
                hint="Set SECRET_KEY in the environment to a long random value of your own.",
                id="agentruns.E001",
            )
        ]
    return []
