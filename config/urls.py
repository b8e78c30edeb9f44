from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from agentruns import health
from agentruns.web import examples
from agentruns.web.layout import navigation
from support import gateway

urlpatterns = [
    # where each user lands (support staff: the ticket queue), also after signing in
    path("", navigation.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include("agentruns.api.urls")),
    path("gateway/refunds", gateway.refunds, name="gateway-refunds"),
    path("healthz", health.healthz, name="healthz"),
    path("metrics", health.metrics, name="metrics"),
    path("runs/", include("agentruns.urls")),
    path("approvals/", include("approvals.web.urls")),
    # the demo's support desk (tickets and orders): its own pages, linked from the layout's
    # navigation through agentruns.web.layout.navigation (the runtime knows nothing of them)
    path("tickets/", include("support.web.urls")),
    path("examples/chat/", examples.chat_page, name="example-chat"),
    path("examples/chat/chat.js", examples.chat_bundle, name="example-chat-bundle"),
]

# Django's error answers: JSON under /api/ (agentruns/api/errors.py), pages of the layout
# elsewhere (agentruns/web/layout/errors.py, which hands /api/ to the former)
handler400 = "agentruns.api.errors.bad_request"
handler403 = "agentruns.web.layout.errors.permission_denied"
handler404 = "agentruns.web.layout.errors.page_not_found"
handler500 = "agentruns.api.errors.server_error"
