"""One env-driven settings module.

Every knob reads the environment with a safe default. The embedded default (no env at all) is
SQLite in WAL mode + django-q2's ORM broker + Channels' in-memory layer with a database poll, so
`make run` needs no server. `DATABASE_URL` switches to PostgreSQL, `REDIS_URL` to channels_redis.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from agentruns.setting import env_bool, env_float, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent


def database_from_url(url: str) -> dict:
    """Parse postgres://user:pass@host:port/name?options into a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(
            f"DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgres://)"
        )
    query: dict = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = unquote(parsed.hostname or "") or query.pop("host", "")
    pooled = env_bool("DB_POOL", True)
    if pooled:
        # psycopg's pool, per process: connections are bounded by it, not by threads (a worker
        # keeps many runs in flight; each holds a connection only while it talks to the database).
        # Django's pool needs CONN_MAX_AGE=0: "closing" a connection returns it to the pool.
        query["pool"] = {
            "min_size": env_int("DB_POOL_MIN_SIZE", 1),
            "max_size": env_int("DB_POOL_MAX_SIZE", 10),
            "timeout": env_float("DB_POOL_TIMEOUT", 30),
            # psycopg retries a lost server with a delay that doubles without a cap until
            # reconnect_timeout (default 5 min: a 30 s outage would then take another 30 s to
            # notice the server is back); giving up after a few seconds lets the next request for
            # a connection start a fresh attempt at once
            "reconnect_timeout": env_float("DB_POOL_RECONNECT_SECONDS", 5),
            "name": "agentruns",
        }
    # a server that drops packets (not one that refuses) must not hang a connect
    query.setdefault("connect_timeout", env_int("DB_CONNECT_TIMEOUT", 5))
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": 0 if pooled else env_int("DB_CONN_MAX_AGE", 60),
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": query,
        "TEST": {"NAME": env_str("TEST_DATABASE_NAME") or None},
    }


# the built-in key is for development only: SECURE_HTTPS=1 refuses it (see "production" below)
BUILTIN_SECRET_KEY = "dev-insecure-change-me-0123456789abcdefghijklmnopqrstuvwxyz"
SECRET_KEY = env_str("SECRET_KEY", BUILTIN_SECRET_KEY)
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = [
    h for h in env_str("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h
]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o]
# a JSON 403 under /api/, Django's page elsewhere
CSRF_FAILURE_VIEW = "agentruns.api.errors.csrf_failure"

# the apps as any project adds them (DESIGN.md 7), then the demo's own and its security apps
INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "channels",
    "django_q",
    "django_htmx",
    "agentruns",
    "approvals",
    "support",
    "axes",
    "csp",
]

MIDDLEWARE = [
    # outermost: a database or Redis outage anywhere below answers 503 "back soon", never 500
    "agentruns.web.outage.AnswerOutagesWithRetryLater",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "agentruns.web.middleware.RefuseUnstorableInput",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "agentruns.web.middleware.AnswerQuotaRefusals",
    "csp.middleware.CSPMiddleware",
    # last, as django-axes requires: it turns a lockout into the lockout page
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        # Django's engine; every page rendered encodable (a stored lone surrogate cannot 500 it)
        "BACKEND": "agentruns.web.engine.EncodableTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    DATABASES = {"default": database_from_url(DATABASE_URL)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(BASE_DIR / "var" / "db.sqlite3")),
            "OPTIONS": {
                # WAL lets the web process read while the worker writes; IMMEDIATE takes the
                # write lock at BEGIN so two writers queue on busy_timeout instead of failing
                # with "database is locked" on lock upgrade.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"  # each user's landing page (agentruns.web.layout.navigation.home)
LOGOUT_REDIRECT_URL = "/accounts/login/"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600)

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"

# --- security: logins, Content Security Policy, production (SECURE_HTTPS) ------------------
# django-axes counts failed logins per (username, address): AXES_FAILURE_LIMIT failures lock that
# pair out for AXES_COOLOFF_MINUTES (the lockout page, status 429) before any password is hashed;
# a success resets the count; an admin unlocks early by deleting the access attempt in the admin
# (or `manage.py axes_reset_username <name>`).
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ENABLED = env_bool("AXES_ENABLED", True)
AXES_VERBOSE = False  # no banner in every process's log
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("AXES_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_HTTP_RESPONSE_CODE = 429
# behind the TLS proxy of SECURE_HTTPS the client address is the proxy's X-Forwarded-For
AXES_IPWARE_PROXY_COUNT = env_int("AXES_PROXY_COUNT", 0) or None
AXES_IPWARE_META_PRECEDENCE_ORDER = (
    ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"] if AXES_IPWARE_PROXY_COUNT else ["REMOTE_ADDR"]
)

# Only our own static files may run or style anything: no inline script, no style attribute, no
# eval (templates keep JS and CSS in the apps' static files). 'self' covers the same-origin
# WebSocket in current browsers.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],
        "font-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

# Production: SECURE_HTTPS=1 behind a TLS-terminating proxy that sets X-Forwarded-Proto.
# `manage.py check --deploy --fail-level WARNING` passes in this mode (tests/web/test_deploy.py).
SECURE_HTTPS = env_bool("SECURE_HTTPS", False)
if SECURE_HTTPS:
    if SECRET_KEY == BUILTIN_SECRET_KEY:
        raise ImproperlyConfigured(
            "SECURE_HTTPS=1 needs a SECRET_KEY of your own (the built-in one is public)"
        )
    if DEBUG:
        raise ImproperlyConfigured("SECURE_HTTPS=1 refuses DEBUG=1: it shows tracebacks to anyone")
    SECURE_SSL_REDIRECT = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes speak plain HTTP inside
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# --- caches: each process's memory. The inbox's cards are rendered once per change and kept as
# fragments (approvals/_item.html: six a card, ~150 for a page of 25), in a cache of their own:
# Django's default holds 300 entries, which two people on different filters would churn. A
# project without "template_fragments" keeps them in its default cache (Django's {% cache %}).
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "template_fragments": {
        "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
        "LOCATION": "template-fragments",
        "TIMEOUT": 600,
        "OPTIONS": {"MAX_ENTRIES": 5000},
    },
}

# --- the channel layer and django-q2 ------------------------------------------------------
# The apps default CHANNEL_LAYERS (channels_redis with REDIS_URL, else in memory) and Q_CLUSTER
# (a doorbell design, tuned by Q_WORKERS, Q_TIMEOUT, ...) as in any project that leaves them
# out: agentruns/installation/defaults.py. django-q2 reads Q_CLUSTER as it is imported, before
# the apps have defaulted it, and warns about the retry and timeout it did not find there; the
# apps' check (agentruns.W110) says it when the cluster in use has them wrong.
warnings.filterwarnings("ignore", "Retry and timeout are misconfigured", UserWarning, "django_q")

# --- the runtime and the demo ---------------------------------------------------------------
# Every AGENTRUNS_* knob (and the model's) is typed and documented in agentruns/conf.py, the
# demo's REFUND_* ones in support/conf.py: both read the environment (or a setting of the same
# name defined here) and refuse values they cannot parse.
APP_BASE_URL = env_str("APP_BASE_URL", "http://127.0.0.1:8000")

# --- email (approvals mail who may decide, batched): the console for `make run`, SMTP when
# EMAIL_HOST is set ------------------------------------------------------------------------
EMAIL_HOST = env_str("EMAIL_HOST")
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend",
)
EMAIL_PORT = env_int("EMAIL_PORT", 587)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", bool(EMAIL_HOST))
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 20)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "agentruns@localhost")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "agentruns.runtime.values.redaction.RedactingFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    # psycopg's pool logs every connection it lends at INFO
    "loggers": {"django.db.backends": {"level": "WARNING"}, "psycopg.pool": {"level": "WARNING"}},
}
