"""django-axes: repeated wrong passwords lock out that username from that address (before any
password is checked), with a clear page and a 429; other users and addresses are unaffected;
an admin unlocks."""

from __future__ import annotations

from axes.models import AccessAttempt
from django.test import Client

LOGIN = "/accounts/login/"


def sign_in(client: Client, username: str, password: str, address: str = "10.0.0.1"):
    return client.post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address)


def test_lockout_after_repeated_failures_and_unlock_by_an_admin(settings, lead, approver):
    limit = settings.AXES_FAILURE_LIMIT
    client = Client()
    for _ in range(limit - 1):
        assert sign_in(client, "approver", "wrong").status_code == 200  # the form again
    locked = sign_in(client, "approver", "wrong")
    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.text and "approver" in locked.text
    # now even the right password is refused from here, without being checked
    assert sign_in(client, "approver", "pw-approver").status_code == 429
    # another address, or another user from this one, can still sign in
    assert sign_in(Client(), "approver", "pw-approver", address="10.0.0.2").status_code == 302
    assert sign_in(Client(), "lead", "pw-lead").status_code == 302

    admin = Client()
    admin.force_login(lead)
    attempt = AccessAttempt.objects.get(username="approver", ip_address="10.0.0.1")
    page = admin.get("/admin/axes/accessattempt/")
    assert page.status_code == 200 and "approver" in page.text
    admin.post(
        "/admin/axes/accessattempt/",
        {"action": "delete_selected", "_selected_action": [attempt.pk], "post": "yes"},
    )
    assert not AccessAttempt.objects.filter(pk=attempt.pk).exists()
    assert sign_in(Client(), "approver", "pw-approver").status_code == 302


def test_seed_demo_passwords_pass_the_validators(db):
    import io

    from django.contrib.auth import authenticate
    from django.contrib.auth.password_validation import validate_password
    from django.core.management import call_command
    from django.test import RequestFactory

    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    printed = [line.split() for line in out.getvalue().splitlines() if " password " in line]
    assert printed
    for _, username, _, password in printed:
        validate_password(password)  # raises if any validator refuses it
        request = RequestFactory().post(LOGIN)
        assert authenticate(request, username=username, password=password) is not None
