"""`manage.py check` for a project that runs the apps: each setting that is missing or wrong,
with the line that fixes it (DESIGN.md 7, "In a host's own Django project"). Errors stop
`migrate`, `qcluster` and `runserver`; `agentruns.asgi` refuses to serve with them too.
SQLite stays a supported single-machine mode (the demo's `make run`; `check --deploy` passes
there, DESIGN.md 6), so only SQLite without its locking settings is warned about."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.urls import NoReverseMatch, resolve, reverse
from django.urls.exceptions import Resolver404

from agentruns.installation.defaults import DOORBELL_BROKER

TAG = "agentruns"

INSTALLED_APPS_LINE = (
    'INSTALLED_APPS = ["daphne", *INSTALLED_APPS, "channels", "django_q", "django_htmx", '
    '"agentruns", "approvals"]'
)
URLS_LINES = 'path("", include("agentruns.urls")) and path("", include("approvals.urls"))'
# the apps (and Django's own that their pages and API use) a project must install
REQUIRED_APPS = (
    "daphne",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_q",
    "django_htmx",
    "agentruns",
    "approvals",
)
REQUIRED_MIDDLEWARE = {
    "django.contrib.sessions.middleware.SessionMiddleware": "sessions (the pages' login)",
    "django.middleware.csrf.CsrfViewMiddleware": "CSRF protection of the pages' forms",
    "django.contrib.auth.middleware.AuthenticationMiddleware": "request.user",
    "django.contrib.messages.middleware.MessageMiddleware": "the pages' messages",
    "django_htmx.middleware.HtmxMiddleware": "request.htmx (the pages' partial swaps)",
}
REQUIRED_CONTEXT_PROCESSORS = (
    "django.template.context_processors.request",
    "django.contrib.auth.context_processors.auth",
    "django.contrib.messages.context_processors.messages",
)
# a URL name of each app, where its include at the project's root puts it
ROUTES = {
    "run-list": ("/runs/", 'path("", include("agentruns.urls"))'),
    "api-openapi": ("/api/openapi.json", 'path("", include("agentruns.urls"))'),
    "healthz": ("/healthz", 'path("", include("agentruns.urls"))'),
    "approval-inbox": ("/approvals/", 'path("", include("approvals.urls"))'),
}
POSTGRESQL = "django.db.backends.postgresql"
SQLITE = "django.db.backends.sqlite3"


@register(TAG)
def check_installed_apps(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The apps and what they run on, with daphne first (its `runserver` serves ASGI)."""
    installed = list(settings.INSTALLED_APPS)
    names = [_app_name(entry) for entry in installed]
    problems: list[CheckMessage] = []
    missing = [app for app in REQUIRED_APPS if app not in names]
    if missing:
        problems.append(
            Error(
                f"INSTALLED_APPS lacks {', '.join(missing)}",
                hint=f"Add them as the apps' docs say: {INSTALLED_APPS_LINE}",
                id="agentruns.E101",
            )
        )
    elif names[0] != "daphne":
        problems.append(
            Error(
                f'"daphne" must come first in INSTALLED_APPS (the first is {installed[0]!r}): '
                "its runserver serves the apps' WebSockets and streams",
                hint=INSTALLED_APPS_LINE,
                id="agentruns.E102",
            )
        )
    return problems


def _app_name(entry: str) -> str:
    """ "agentruns.apps.AgentRunsConfig" -> "agentruns"; a plain module path as it is."""
    if ".apps." in entry:
        return entry.split(".apps.")[0]
    return entry


@register(TAG)
def check_middleware(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    listed = set(settings.MIDDLEWARE)
    return [
        Error(
            f"MIDDLEWARE lacks {path} ({why})",
            hint=f'Add "{path}" to MIDDLEWARE'
            + (" (after AuthenticationMiddleware)" if "htmx" in path else ""),
            id="agentruns.E103",
        )
        for path, why in REQUIRED_MIDDLEWARE.items()
        if path not in listed
    ]


@register(TAG, Tags.urls)
def check_urls(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The apps' URLs are included at the root: the API's answers are keyed on /api/."""
    problems: list[CheckMessage] = []
    for name, (expected, line) in ROUTES.items():
        try:
            found = reverse(name)
        except NoReverseMatch:
            problems.append(
                Error(
                    f"the URL {expected} ({name!r}) is not in ROOT_URLCONF",
                    hint=f"Add {line} to urlpatterns in {settings.ROOT_URLCONF}",
                    id="agentruns.E104",
                )
            )
            continue
        if found != expected:
            problems.append(
                Error(
                    f"the URL {name!r} is at {found}, not {expected}: the apps are included "
                    "at the root of the URLconf",
                    hint=f"Include them with {line}",
                    id="agentruns.E104",
                )
            )
    return problems


@register(TAG)
def check_templates(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The apps' pages are Django templates in the apps, rendered with the request and user."""
    django_engines = [
        engine
        for engine in settings.TEMPLATES
        if issubclass(
            _import(engine.get("BACKEND", "")) or object,
            _import("django.template.backends.django.DjangoTemplates"),
        )
    ]
    loads_apps = [
        engine
        for engine in django_engines
        if engine.get("APP_DIRS")
        or "django.template.loaders.app_directories.Loader"
        in str(engine.get("OPTIONS", {}).get("loaders", ""))
    ]
    if not loads_apps:
        return [
            Error(
                "no DjangoTemplates engine in TEMPLATES loads the apps' templates",
                hint='Set "APP_DIRS": True on the DjangoTemplates engine in TEMPLATES',
                id="agentruns.E105",
            )
        ]
    processors = loads_apps[0].get("OPTIONS", {}).get("context_processors", [])
    missing = [p for p in REQUIRED_CONTEXT_PROCESSORS if p not in processors]
    if missing:
        return [
            Error(
                f"TEMPLATES' context_processors lack {', '.join(missing)} (the apps' pages show "
                "the signed-in user, their permissions and messages)",
                hint=f'Add {", ".join(f"{p!r}" for p in missing)} to TEMPLATES[0]["OPTIONS"]'
                '["context_processors"]',
                id="agentruns.E105",
            )
        ]
    return []


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


@register(TAG, Tags.database)
def check_database(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """PostgreSQL (with a connection pool), or SQLite set up for one machine."""
    default = settings.DATABASES.get("default", {})
    engine = default.get("ENGINE", "")
    options = default.get("OPTIONS", {})
    if engine == POSTGRESQL:
        if not options.get("pool"):
            return [
                Warning(
                    "DATABASES['default'] has no connection pool: each of a worker's runs in "
                    "flight (AGENTRUNS_RUNS_PER_PROCESS) then opens a connection of its own",
                    hint='Add "OPTIONS": {"pool": True} to DATABASES["default"] (with '
                    '"CONN_MAX_AGE": 0, Django\'s default)',
                    id="agentruns.W106",
                )
            ]
        return []
    if engine == SQLITE:
        if options.get("transaction_mode") != "IMMEDIATE":
            return [
                Warning(
                    "DATABASES['default'] is SQLite without IMMEDIATE transactions: the web and "
                    "the worker writing at once fail with 'database is locked' (and production "
                    "needs PostgreSQL: many processes, SKIP LOCKED claims, LISTEN/NOTIFY)",
                    hint=f'Set DATABASES["default"] to your PostgreSQL ("ENGINE": "{POSTGRESQL}"), '
                    'or for one machine add "OPTIONS": {"transaction_mode": "IMMEDIATE", '
                    '"timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}',
                    id="agentruns.W106",
                )
            ]
        return []
    return [
        Error(
            f"DATABASES['default'] uses {engine!r}: the apps run on PostgreSQL (or SQLite on "
            "one machine)",
            hint=f'Set DATABASES["default"]["ENGINE"] = "{POSTGRESQL}" and your server\'s '
            "NAME, USER, PASSWORD, HOST and PORT",
            id="agentruns.E106",
        )
    ]


@register(TAG)
def check_agent_modules(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    from agentruns.conf import conf

    problems: list[CheckMessage] = []
    for module in filter(None, (m.strip() for m in conf.AGENT_MODULES.split(","))):
        try:
            found = find_spec(module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            problems.append(
                Error(
                    f"AGENTRUNS_AGENT_MODULES names {module!r}, which cannot be imported",
                    hint="Name your agent modules by their import path, comma-separated, e.g. "
                    'AGENTRUNS_AGENT_MODULES = "shop.agents"',
                    id="agentruns.E108",
                )
            )
    return problems


@register(TAG)
def check_login_url(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """Signed-out visitors of the pages are sent to LOGIN_URL: it must be a page."""
    login_url = str(settings.LOGIN_URL)
    if "/" not in login_url:  # a URL name
        try:
            reverse(login_url)
            return []
        except NoReverseMatch:
            pass
    elif login_url.startswith(("http://", "https://")):
        return []  # a login service elsewhere
    else:
        try:
            resolve(login_url.split("?")[0])
            return []
        except Resolver404:
            pass
    return [
        Warning(
            f"LOGIN_URL ({login_url!r}) is no page of this project: signed-out visitors of "
            "/runs/ and /approvals/ are sent there",
            hint='Add path("accounts/", include("django.contrib.auth.urls")) to your URLconf, '
            'or set LOGIN_URL to your login page (e.g. LOGIN_URL = "admin:login")',
            id="agentruns.W109",
        )
    ]


@register(TAG)
def check_q_cluster(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """A project's own Q_CLUSTER must keep what the doorbell design relies on."""
    cluster = getattr(settings, "Q_CLUSTER", {}) or {}
    hint = (
        "Start from the apps' cluster: `from agentruns.installation.defaults import "
        "doorbell_cluster` and Q_CLUSTER = doorbell_cluster(<your changes>), or leave "
        "Q_CLUSTER out"
    )
    problems: list[CheckMessage] = []
    if cluster.get("broker_class") != DOORBELL_BROKER or not cluster.get("orm"):
        problems.append(
            Error(
                f'Q_CLUSTER needs "orm": "default" and "broker_class": "{DOORBELL_BROKER}" '
                "(runs are rung on the database they are stored in, with delayed doorbells)",
                hint=hint,
                id="agentruns.E110",
            )
        )
    timeout, retry = cluster.get("timeout"), cluster.get("retry", 60)
    if not timeout or timeout >= retry or not cluster.get("ack_failures"):
        problems.append(
            Warning(
                'Q_CLUSTER needs a "timeout" below its "retry" and "ack_failures": True, or a '
                "doorbell is rung twice at once or forever",
                hint=hint,
                id="agentruns.W110",
            )
        )
    return problems


@register(TAG)
def check_channel_layers(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    if "default" in (getattr(settings, "CHANNEL_LAYERS", {}) or {}):
        return []
    return [
        Warning(
            "CHANNEL_LAYERS has no 'default' layer: the streams fall back to polling the "
            "database alone",
            hint="Leave CHANNEL_LAYERS out (the apps default it from REDIS_URL) or add a "
            '"default" layer',
            id="agentruns.W111",
        )
    ]


def errors() -> list[CheckMessage]:
    """The checks above that are errors, run now (agentruns.asgi refuses to serve with any)."""
    from django.core.checks import run_checks

    return [m for m in run_checks(tags=[TAG]) if m.is_serious()]
