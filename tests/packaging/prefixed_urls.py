"""A URLconf that mounts the apps under a prefix (the check refuses it: tests/packaging/test_checks.py)."""

from django.urls import include, path

urlpatterns = [
    path("tools/", include("agentruns.urls")),
    path("tools/", include("approvals.urls")),
]
