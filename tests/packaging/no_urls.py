"""A URLconf without the apps' URLs (tests/packaging/test_checks.py)."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
