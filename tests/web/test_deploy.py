"""SECURE_HTTPS=1: `check --deploy --fail-level WARNING` passes, the built-in key and DEBUG are
refused at start-up, and the headers a browser sees say HTTPS only."""

from __future__ import annotations

import subprocess

import pytest

from tests.procs import base_env, run_manage

REAL_KEY = "k" * 20 + "-a-real-secret-key-for-this-test-0123456789-ABCDEFGHIJ"


def manage(*args: str, **env: object) -> subprocess.CompletedProcess:
    environment = {**base_env(), "DATABASE_URL": "", **{k: str(v) for k, v in env.items()}}
    if "SECRET_KEY" not in env:
        environment.pop("SECRET_KEY", None)
    # the test runner's own (Playwright needs it); a deployment never sets it
    environment.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    return run_manage(environment, *args)


def test_check_deploy_passes_in_production_mode():
    done = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECURE_HTTPS=1,
        SECRET_KEY=REAL_KEY,
        DEBUG=0,
        ALLOWED_HOSTS="agents.example.com",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


def test_check_deploy_fails_without_production_mode():
    done = manage("check", "--deploy", "--fail-level", "WARNING", SECRET_KEY=REAL_KEY)
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr + done.stdout


def test_check_deploy_notices_the_builtin_key():
    done = manage("check", "--deploy")
    assert done.returncode != 0 and "agentruns.E001" in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("env", "refusal"),
    [
        ({"SECURE_HTTPS": 1}, "SECRET_KEY"),
        ({"SECURE_HTTPS": 1, "SECRET_KEY": REAL_KEY, "DEBUG": 1}, "DEBUG"),
    ],
)
def test_production_mode_refuses_to_start(env: dict, refusal: str):
    done = manage("check", **env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and refusal in done.stderr


def test_secure_headers_and_cookies(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    assert client.get("/accounts/login/").status_code == 301  # plain HTTP is redirected
    page = client.get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
    assert page.status_code == 200
    assert page["Strict-Transport-Security"].startswith("max-age=3600")
    assert page.cookies["csrftoken"]["secure"]
    policy = page["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
