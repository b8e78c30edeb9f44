"""The demo's ASGI entry: the apps' own (`agentruns.asgi`) for these settings.
`python -m config.serve config.asgi:application` (the Procfile), or daphne or uvicorn."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from agentruns.asgi import application  # noqa: E402, F401
