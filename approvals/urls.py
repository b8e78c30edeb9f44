"""The approvals app's pages, included at the root of a project's URLconf
(`path("", include("approvals.urls"))`, DESIGN.md 7): the inbox under /approvals/. Its JSON
endpoints are declared in `approvals/api/` and served under /api/ by `agentruns.urls`."""

from django.urls import include, path

urlpatterns = [
    path("approvals/", include("approvals.web.urls")),
]
