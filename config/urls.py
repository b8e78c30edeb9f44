"""The demo project's URLs: the apps included as any project includes them (DESIGN.md 7), then
the demo's own pages (login, the support desk, the refund gateway, the chat example)."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from agentruns.api.urls import not_found
from agentruns.web.layout import navigation
from config import examples
from support import gateway

urlpatterns = [
    # where each user lands (support staff: the ticket queue), also after signing in
    path("", navigation.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # /runs/, /api/, /healthz, /metrics; /approvals/
    path("", include("agentruns.urls")),
    path("", include("approvals.urls")),
    path("gateway/refunds", gateway.refunds, name="gateway-refunds"),
    # the demo's support desk (tickets and orders): its own pages, linked from the layout's
    # navigation through agentruns.web.layout.navigation (the runtime knows nothing of them)
    path("tickets/", include("support.web.urls")),
    path("examples/chat/", examples.chat_page, name="example-chat"),
    path("examples/chat/chat.js", examples.chat_bundle, name="example-chat-bundle"),
    # this project serves no other API: every other /api/ path is the API's JSON 404 too
    re_path(r"^api/(?P<rest>.*)$", not_found),
]

# Django's error answers: JSON under /api/ (agentruns/api/errors.py), pages of the layout
# elsewhere (agentruns/web/layout/errors.py, which hands /api/ to the former)
handler400 = "agentruns.api.errors.bad_request"
handler403 = "agentruns.web.layout.errors.permission_denied"
handler404 = "agentruns.web.layout.errors.page_not_found"
handler500 = "agentruns.api.errors.server_error"
