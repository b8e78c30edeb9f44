"""Shared fixtures: users with the demo roles and an operator, an API client, the demo data, the
state of the shared test tools, and real server processes."""

from __future__ import annotations

import os

import pytest
from django.contrib.auth.models import Group
from django.db import connection

from tests import (  # (testkit registers the shared test agents and tools)
    bytecode,
    pgserver,
    seed_snapshot,
    testkit,
)
from tests.helpers import ApiClient, make_user  # (importable from here too, as older tests do)
from tests.procs import Proc
from tests.scheduling import pytest_collection_modifyitems  # noqa: F401  (the slowest first)

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is None:  # the main process: before any worker
        bytecode.compile_checkout()
        pgserver.share_template_dir()
    # a transactional test's flush writes post_migrate's rows back from a copy
    seed_snapshot.install_after_flush()


def pytest_unconfigure(config: pytest.Config) -> None:
    if getattr(config, "workerinput", None) is None:
        pgserver.remove_template_dir()


@pytest.fixture(autouse=True)
def _fast_settings(settings, tmp_path):
    settings.SCRIPTED_MODEL_DELAY_MS = 0
    settings.AGENTRUNS_FAILPOINT_DIR = str(tmp_path / "failpoints")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _no_connection_left_broken():
    """A test that took the database away (tests/runtime/dbfaults.py) may leave this thread's
    connection terminated; in a web process the request's end would close it, here nothing
    would, and every later test of the process would fail with "the connection is closed"
    (seen once in a suite run, on every browser test after it). Given back, the next query
    connects afresh. Inside a test's transaction nothing can be done, nor is anything broken."""
    if connection.connection is not None and not connection.in_atomic_block:
        if not connection.is_usable():
            connection.close()
    yield


@pytest.fixture
def seeded(db):
    """seed_demo's orders, tickets, roles, users and the trainees' policy (tests/seed_snapshot.py:
    the command's own rows, written back in a dozen statements instead of its ~480)."""
    seed_snapshot.seed()


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
