"""The rules the streams' recheck applies to a viewer (stream/access/viewers.py `endings`), in
process on the real PostgreSQL: every change to the user, their own or their groups'
permissions, their session or their token that takes the right to watch, and the ones that do
not; and the check's cost, three queries whatever the number of viewers.

The real daphne tests (test_stream_rights.py, test_socket_limits.py) hold the 2 s end to end;
this module holds the cases they do not drive one by one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentruns.models import ApiToken
from agentruns.stream.access.viewers import (
    CREDENTIAL_GONE,
    RIGHT_GONE,
    Credential,
    Viewer,
    endings,
)
from agentruns.tokens import create_token, hash_token, revoke
from tests.helpers import _perm, make_user

pytestmark = pytest.mark.django_db


def token_viewer(user) -> tuple[Viewer, str]:
    raw = create_token(user)
    return Viewer(Credential("token", hash_token(raw)), str(user.pk)), raw


def session_viewer(user) -> Viewer:
    browser = Client()
    browser.force_login(user)
    return Viewer(Credential("session", browser.session.session_key), str(user.pk))


def code_of(viewer: Viewer) -> int | None:
    ending = endings([viewer]).get(viewer)
    return ending.code if ending else None


def test_a_viewer_who_keeps_the_right_keeps_watching(django_user_model):
    own = make_user(django_user_model, "own", ["agentruns.view_run"])
    group = Group.objects.create(name="viewers")
    group.permissions.add(_perm("agentruns.view_run"))
    member = make_user(django_user_model, "member")
    member.groups.add(group)
    superuser = make_user(django_user_model, "root", superuser=True)
    viewers = [
        *(token_viewer(user)[0] for user in (own, member, superuser)),
        *(session_viewer(user) for user in (own, member, superuser)),
    ]
    assert endings(viewers) == {}


@pytest.mark.parametrize(
    "change, code",
    [
        ("own permission removed", RIGHT_GONE),
        ("deactivated", CREDENTIAL_GONE),
        ("deleted", CREDENTIAL_GONE),
        ("password changed", CREDENTIAL_GONE),
        ("signed out", CREDENTIAL_GONE),
        ("session expired", CREDENTIAL_GONE),
    ],
)
def test_a_session_viewer_loses_the_right(django_user_model, change, code):
    user = make_user(django_user_model, "watcher", ["agentruns.view_run"])
    viewer = session_viewer(user)
    key = viewer.credential.value
    assert code_of(viewer) is None
    if change == "own permission removed":
        user.user_permissions.remove(_perm("agentruns.view_run"))
    elif change == "deactivated":
        type(user).objects.filter(pk=user.pk).update(is_active=False)
    elif change == "deleted":
        user.delete()
    elif change == "password changed":
        user.set_password("a new and different one")
        user.save()
    elif change == "signed out":
        Session.objects.filter(pk=key).delete()
    elif change == "session expired":
        Session.objects.filter(pk=key).update(expire_date=timezone.now() - timedelta(seconds=1))
    assert code_of(viewer) == code


@pytest.mark.parametrize("change", ["revoked", "expired", "deactivated"])
def test_a_token_viewer_loses_the_credential(django_user_model, change):
    user = make_user(django_user_model, "watcher", ["agentruns.view_run"])
    viewer, _ = token_viewer(user)
    assert code_of(viewer) is None
    tokens = ApiToken.objects.filter(token_hash=viewer.credential.value)
    if change == "revoked":
        revoke(tokens)
    elif change == "expired":
        tokens.update(expires_at=timezone.now() - timedelta(seconds=1))
    else:
        type(user).objects.filter(pk=user.pk).update(is_active=False)
    assert code_of(viewer) == CREDENTIAL_GONE


def test_the_recheck_is_three_queries_whatever_the_number_of_viewers(django_user_model):
    viewers = []
    for i in range(20):
        user = make_user(django_user_model, f"u{i}", ["agentruns.view_run"])
        viewers += [token_viewer(user)[0], session_viewer(user)]
    group = Group.objects.create(name="gone")
    lost = make_user(django_user_model, "lost")
    lost.groups.add(group)  # the group without view_run
    lost_viewer = token_viewer(lost)[0]
    with CaptureQueriesContext(connection) as queries:
        ended = endings([*viewers, lost_viewer])
    assert len(queries) == 3
    assert {v: e.code for v, e in ended.items()} == {lost_viewer: RIGHT_GONE}
