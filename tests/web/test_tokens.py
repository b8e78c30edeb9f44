"""API tokens expire (90 days by default, shown), are listed and revoked by command or in the
admin, and a revoked or expired token is refused at once: requests and open sockets."""

from __future__ import annotations

import io
import json
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from agentruns.models import ApiToken, Run
from agentruns.tokens import create_token
from tests.procs import start_web, wait_until


def command(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def api_status(token: str) -> int:
    return Client().get("/api/approvals", HTTP_AUTHORIZATION=f"Bearer {token}").status_code


def test_a_new_token_expires_in_90_days_and_says_so(lead):
    out, err = command("create_api_token", "lead")
    token = out.strip().splitlines()[-1]
    assert token.startswith("art_") and " " not in token
    row = ApiToken.objects.get(prefix=token[:10])
    assert abs((row.expires_at - timezone.now()) - timedelta(days=90)) < timedelta(minutes=1)
    assert f"expires {row.expires_at:%Y-%m-%d}" in err
    assert api_status(token) == 200


@pytest.mark.parametrize("days", ["nan", "inf", "-inf", "1e9", "3651", "-1"])
def test_create_api_token_refuses_days_it_cannot_honour(lead, days):
    """A clear CommandError (exit code 1, one line), never a traceback, and no token made."""
    with pytest.raises(CommandError, match="days must be a number from 0"):
        command("create_api_token", "lead", f"--days={days}")
    assert not ApiToken.objects.exists()
    out, _ = command("create_api_token", "lead", "--days", "3650")  # the longest there is
    assert ApiToken.objects.get(prefix=out.strip()[:10]).expires_at.year >= timezone.now().year + 9


def test_a_token_lifetime_setting_past_the_maximum_fails_loudly(lead, settings):
    settings.AGENTRUNS_API_TOKEN_DAYS = 1e9
    with pytest.raises(ImproperlyConfigured, match="above its maximum"):
        create_token(lead)


def test_an_expired_token_is_refused(lead):
    token = create_token(lead)
    assert api_status(token) == 200
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert api_status(token) == 401


def test_list_and_revoke_commands(lead, approver):
    mine, theirs = create_token(lead), create_token(approver)
    listed, _ = command("list_api_tokens")
    assert mine[:10] in listed and theirs[:10] in listed and "active" in listed
    assert mine not in listed  # never the token itself
    out, _ = command("revoke_api_token", mine[:10])
    assert "revoked 1" in out
    assert api_status(mine) == 401 and api_status(theirs) == 200
    assert mine[:10] not in command("list_api_tokens")[0]
    assert "revoked" in command("list_api_tokens", "--all")[0]
    command("revoke_api_token", "--user", "approver")
    assert api_status(theirs) == 401


def test_admin_action_revokes(lead):
    token = create_token(lead)
    admin = Client()
    admin.force_login(lead)
    row = ApiToken.objects.get()
    page = admin.get("/admin/agentruns/apitoken/")
    assert page.status_code == 200 and row.prefix in page.text and "expires" in page.text.lower()
    done = admin.post(
        "/admin/agentruns/apitoken/",
        {"action": "revoke_tokens", "_selected_action": [row.pk]},
        follow=True,
    )
    assert "Revoked 1 token" in done.text
    assert api_status(token) == 401


@pytest.mark.django_db(transaction=True)
def test_an_open_socket_closes_when_its_token_is_revoked(tmp_path, lead):
    web, url = start_web(tmp_path)
    try:
        run = Run.objects.create(agent="script", input={}, status="running")
        token = create_token(lead)
        ws_url = url.replace("http", "ws") + f"/ws/runs/{run.id}/?after=0"
        auth = {"Authorization": f"Bearer {token}"}
        with connect(ws_url, origin=url, additional_headers=auth) as socket:
            socket.send(json.dumps({"type": "ping"}))
            assert json.loads(socket.recv(timeout=10))["type"] == "pong"  # open and authorised
            ApiToken.objects.update(revoked=True)
            closed = wait_until(lambda: _closed(socket), timeout=30, message="the socket to close")
            assert closed.code == 4401
        with connect(ws_url, origin=url, additional_headers=auth) as again:
            assert wait_until(lambda: _closed(again), timeout=10).code == 4401
    finally:
        web.kill()


def _closed(socket):
    """The close frame the server sent, once it has (None while the socket is open)."""
    try:
        socket.recv(timeout=0.5)
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        return exc.rcvd
    return None
