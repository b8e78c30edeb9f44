"""The agentruns app's URLs, included at the root of a project's URLconf
(`path("", include("agentruns.urls"))`, DESIGN.md 7): the run pages under /runs/, the JSON API
under /api/ (the approvals app's endpoints with it: every installed app's `api` module declares
its own), and the probes /healthz and /metrics. The API's JSON answers are keyed on the /api/
prefix, so the include is at the root."""

from django.urls import include, path

from agentruns import health

urlpatterns = [
    path("runs/", include("agentruns.web.urls")),
    path("api/", include("agentruns.api.urls")),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics, name="metrics"),
]
