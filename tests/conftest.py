"""Shared fixtures: users with the three demo roles, API clients, and real server processes."""

from __future__ import annotations

import json
import os

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.test import Client

from agentruns.tokens import create_token
from tests import testkit  # (registers the shared test agents and tools)
from tests.procs import Proc

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _perm(dotted: str) -> Permission:
    app_label, codename = dotted.split(".")
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


@pytest.fixture(autouse=True)
def _fast_settings(settings, tmp_path):
    settings.SCRIPTED_MODEL_DELAY_MS = 0
    settings.AGENTRUNS_FAILPOINT_DIR = str(tmp_path / "failpoints")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def seeded(db):
    with open(os.devnull, "w") as devnull:
        call_command("seed_demo", stdout=devnull)


def make_user(django_user_model, username: str, perms: list[str] = (), superuser: bool = False):
    user = django_user_model.objects.create_user(username=username, password="pw-" + username)
    if superuser:
        user.is_superuser = user.is_staff = True
        user.save()
    for p in perms:
        user.user_permissions.add(_perm(p))
    return django_user_model.objects.get(pk=user.pk)


@pytest.fixture
def lead(db, django_user_model):
    return make_user(django_user_model, "lead", superuser=True)


@pytest.fixture
def approver(db, django_user_model):
    return make_user(
        django_user_model,
        "approver",
        ["agentruns.view_run", "approvals.view_approval", "approvals.decide_approval"],
    )


@pytest.fixture
def viewer(db, django_user_model):
    return make_user(django_user_model, "viewer", ["agentruns.view_run", "approvals.view_approval"])


@pytest.fixture
def operator(db, django_user_model):
    """May look and operate runs, nothing else (no superuser shortcut)."""
    return make_user(django_user_model, "operator", ["agentruns.view_run", "agentruns.operate_run"])


class ApiClient:
    """A Django test client that sends a real bearer token on every request."""

    def __init__(self, user) -> None:
        self.token = create_token(user)
        self.client = Client()
        self.user = user

    def _headers(self, extra: dict | None) -> dict:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}", **(extra or {})}

    def get(self, path: str, **extra):
        return self.client.get(path, **self._headers(extra))

    def post(self, path: str, data=None, raw: str | None = None, **extra):
        body = raw if raw is not None else json.dumps(data if data is not None else {})
        return self.client.post(path, body, content_type="application/json", **self._headers(extra))


@pytest.fixture
def api(lead):
    return ApiClient(lead)


@pytest.fixture
def group_roles(db):
    for name in ("viewer", "approver"):
        Group.objects.get_or_create(name=name)


@pytest.fixture(autouse=True)
def _reset_testkit():
    testkit.reset()
    yield
    testkit.reset()


@pytest.fixture
def procs():
    """Every process a test starts (append them); all are SIGKILLed (by their own process group)
    afterwards, before pytest-django truncates the tables they use."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()
