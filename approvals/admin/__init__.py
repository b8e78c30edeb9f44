"""The approvals' admin (read-only records): found by Django's admin autodiscovery."""

from approvals.admin import approvals, webhooks  # noqa: F401  (each registers its ModelAdmins)
