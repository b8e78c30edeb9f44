"""The example front end of the AI SDK chat endpoint (examples/chat/): a page and its bundle.

The page is ours (login, the base layout, the CSRF token for the session's POSTs); the
script is the example's esbuild bundle (`make example`), built from examples/chat/src on the
`ai` package's own client. Until it is built, the page says how.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import render

BUNDLE = Path(settings.BASE_DIR) / "examples" / "chat" / "dist" / "chat.js"


@login_required
def chat_page(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "examples/chat.html",
        {"built": BUNDLE.is_file(), "agent": request.GET.get("agent", "refund")[:100]},
    )


@login_required
def chat_bundle(request: HttpRequest) -> FileResponse:
    if not BUNDLE.is_file():
        raise Http404("the example is not built: run `make example`")
    response = FileResponse(BUNDLE.open("rb"), content_type="text/javascript")
    response["Cache-Control"] = "no-cache"
    return response
