"""`manage.py check` in a project that runs the apps names what is missing or wrong with the line
to add (agentruns/installation/checks.py), and the settings of other libraries the apps need
are defaulted only when a project leaves them out (agentruns/installation/defaults.py). The
whole project, from a fresh venv, is tests/packaging/test_host_project.py."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.test import override_settings
from django_q.conf import Conf

from agentruns.installation import checks, defaults


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_the_demo_project_passes_every_check_of_the_apps():
    assert run_checks(tags=[checks.TAG]) == []


def test_a_missing_middleware_is_named_with_the_line_to_add(settings):
    settings.MIDDLEWARE = [
        m for m in settings.MIDDLEWARE if m != "django_htmx.middleware.HtmxMiddleware"
    ]
    (problem,) = checks.check_middleware(None)
    assert problem.id == "agentruns.E103" and "HtmxMiddleware" in problem.msg
    assert '"django_htmx.middleware.HtmxMiddleware"' in problem.hint


def test_daphne_first_and_every_app_installed(settings):
    apps = [a for a in settings.INSTALLED_APPS if a != "daphne"]
    settings.INSTALLED_APPS = [*apps, "daphne"]
    (problem,) = checks.check_installed_apps(None)
    assert problem.id == "agentruns.E102" and checks.INSTALLED_APPS_LINE in problem.hint
    settings.INSTALLED_APPS = [a for a in apps if a != "django_htmx"]
    (problem,) = checks.check_installed_apps(None)
    assert problem.id == "agentruns.E101" and "django_htmx" in problem.msg


def test_agent_modules_that_cannot_be_imported_are_named(settings):
    settings.AGENTRUNS_AGENT_MODULES = "tests.testkit, shop.no_such_agents"
    (problem,) = checks.check_agent_modules(None)
    assert problem.id == "agentruns.E108" and "'shop.no_such_agents'" in problem.msg


def test_the_urls_must_be_included_at_the_root():
    with override_settings(ROOT_URLCONF="tests.packaging.prefixed_urls"):
        problems = checks.check_urls(None)
    assert ids(problems) == ["agentruns.E104"] * 4
    assert "/tools/runs/" in problems[0].msg
    with override_settings(ROOT_URLCONF="tests.packaging.no_urls"):
        problems = checks.check_urls(None)
    assert 'include("approvals.urls")' in problems[-1].hint


def test_templates_need_the_apps_and_the_request(settings):
    engine = {**settings.TEMPLATES[0], "APP_DIRS": True}
    engine["OPTIONS"] = {"context_processors": ["django.template.context_processors.request"]}
    settings.TEMPLATES = [engine]
    (problem,) = checks.check_templates(None)
    assert problem.id == "agentruns.E105" and "auth.context_processors.auth" in problem.msg
    settings.TEMPLATES = [{**engine, "APP_DIRS": False}]
    assert ids(checks.check_templates(None)) == ["agentruns.E105"]


def test_a_login_url_that_is_no_page_is_warned_about(settings):
    settings.LOGIN_URL = "/signin/"
    (problem,) = checks.check_login_url(None)
    assert problem.id == "agentruns.W109" and "django.contrib.auth.urls" in problem.hint
    settings.LOGIN_URL = "login"  # a URL name of the demo's
    assert checks.check_login_url(None) == []


def test_a_projects_own_q_cluster_must_keep_the_doorbell(settings):
    settings.Q_CLUSTER = {"name": "shop", "orm": "default", "timeout": 60, "retry": 30}
    assert ids(checks.check_q_cluster(None)) == ["agentruns.E110", "agentruns.W110"]
    settings.Q_CLUSTER = defaults.doorbell_cluster(workers=4)
    assert checks.check_q_cluster(None) == []


def test_library_settings_are_defaulted_only_when_left_out(settings):
    del settings.CHANNEL_LAYERS
    del settings.ASGI_APPLICATION
    own = defaults.doorbell_cluster(workers=7)
    settings.Q_CLUSTER = own
    assert defaults.apply() == ["CHANNEL_LAYERS", "ASGI_APPLICATION"]
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer"
    assert settings.ASGI_APPLICATION == "agentruns.asgi.application"
    assert settings.Q_CLUSTER is own


@pytest.fixture
def q2_conf_restored():
    yield
    defaults.reread_q2_conf()  # from the settings as they are again


def test_django_q2_reads_a_defaulted_cluster_again(q2_conf_restored, monkeypatch):
    monkeypatch.setenv("Q_WORKERS", "5")
    with override_settings(Q_CLUSTER=defaults.doorbell_cluster()):
        defaults.reread_q2_conf()
        assert (Conf.WORKERS, Conf.QUEUE_LIMIT, Conf.BROKER_CLASS) == (
            5,
            5,
            defaults.DOORBELL_BROKER,
        )
