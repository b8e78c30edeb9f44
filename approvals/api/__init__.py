"""The approvals' JSON API (DESIGN.md 6): found by the API's URLconf, which imports the `api`
module of every installed app (agentruns/api/urls.py), as the admin finds `admin` modules."""

from approvals.api import actions, approvals  # noqa: F401  (each declares its endpoints)
