"""/static/ for daphne (which serves no files itself), refusing hostile paths with a 404.

Django's ASGIStaticFilesHandler turns only Http404 into a response: a path that climbs out of the
static directories (`/static/../settings.py`, SuspiciousFileOperation) or holds a NUL byte
(ValueError from the file system) was a 500.
"""

from __future__ import annotations

from typing import Any

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousFileOperation
from django.http import Http404


class StaticFiles(ASGIStaticFilesHandler):
    def serve(self, request: Any) -> Any:
        try:
            return super().serve(request)
        except (SuspiciousFileOperation, ValueError, OSError):
            raise Http404("no such file") from None
