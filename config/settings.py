"""One env-driven settings module.

Every knob reads the environment with a safe default. The embedded default (no env at all) is
SQLite in WAL mode + django-q2's ORM broker + Channels' in-memory layer with a database poll, so
`make run` needs no server. `DATABASE_URL` switches to PostgreSQL, `REDIS_URL` to channels_redis.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def database_from_url(url: str) -> dict:
    """Parse postgres://user:pass@host:port/name?options into a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported (use postgres://)")
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = unquote(parsed.hostname or "") or query.pop("host", "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": env_int("DB_CONN_MAX_AGE", 60),
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": query,
        "TEST": {"NAME": env_str("TEST_DATABASE_NAME") or None},
    }


SECRET_KEY = env_str("SECRET_KEY", "dev-insecure-change-me-0123456789abcdefghijklmnopqrstuvwxyz")
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    # agentruns first: its `qcluster` command wraps django-q2's to start the fast sweeper.
    "agentruns",
    "approvals",
    "support",
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django_htmx",
    "django_q",
    "channels",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "agentruns.web.context_processors.navigation",
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
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/approvals/"
LOGOUT_REDIRECT_URL = "/accounts/login/"
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 12 * 3600)

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"

# --- channels ------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- django-q2: a doorbell; the database lease decides who runs ------------------------------
Q_WORKERS = env_int("Q_WORKERS", 2)
Q_TIMEOUT = env_int("Q_TIMEOUT", 120)
Q_CLUSTER = {
    "name": env_str("Q_CLUSTER_NAME", "agentruns"),
    "orm": "default",
    "workers": Q_WORKERS,
    "timeout": Q_TIMEOUT,
    "retry": env_int("Q_RETRY", Q_TIMEOUT * 3 + 60),
    "queue_limit": Q_WORKERS,
    "bulk": 1,
    "poll": env_float("Q_POLL", 0.1),
    "ack_failures": True,
    "max_attempts": 1,
    "save_limit": -1,
    "catch_up": False,
    "label": "Task queue",
}

# --- the runtime ---------------------------------------------------------------------------
AGENTRUNS_MODEL = env_str("AGENTRUNS_MODEL", "scripted")
SCRIPTED_MODEL_DELAY_MS = env_float("SCRIPTED_MODEL_DELAY_MS", 15)
OPENAI_BASE_URL = env_str("OPENAI_BASE_URL", "https://api.openai.com/v1")
OPENAI_API_KEY = env_str("OPENAI_API_KEY", "")
OPENAI_TIMEOUT_SECONDS = env_float("OPENAI_TIMEOUT_SECONDS", 60)
OPENAI_MAX_RETRIES = env_int("OPENAI_MAX_RETRIES", 4)
# price per million tokens by model: "gpt-4o-mini=0.15/0.60,other=1/2" (prompt/completion)
AGENTRUNS_MODEL_PRICES = env_str("AGENTRUNS_MODEL_PRICES", "")
# a run whose model cost (by the price table) reaches this stops with stop_reason cost_budget
AGENTRUNS_MAX_COST_USD = env_float("AGENTRUNS_MAX_COST_USD", 0)  # 0: no limit
# JSON object merged into every OpenAI-compatible request, e.g. {"temperature": 0}
OPENAI_REQUEST_OPTIONS = env_str("OPENAI_REQUEST_OPTIONS", "")

AGENTRUNS_LEASE_TTL_SECONDS = env_float("AGENTRUNS_LEASE_TTL_SECONDS", 15)
AGENTRUNS_SWEEP_INTERVAL_SECONDS = env_float("AGENTRUNS_SWEEP_INTERVAL_SECONDS", 2)
# a run that holds a worker this long re-enqueues itself so q2's task timeout never fires
AGENTRUNS_SLICE_SECONDS = env_float("AGENTRUNS_SLICE_SECONDS", Q_TIMEOUT / 2)
AGENTRUNS_DEFAULT_MAX_STEPS = env_int("AGENTRUNS_DEFAULT_MAX_STEPS", 25)
AGENTRUNS_DELTA_FLUSH_MS = env_float("AGENTRUNS_DELTA_FLUSH_MS", 50)
AGENTRUNS_DELTA_FLUSH_CHARS = env_int("AGENTRUNS_DELTA_FLUSH_CHARS", 200)
AGENTRUNS_FAILPOINTS = env_str("AGENTRUNS_FAILPOINTS", "")
AGENTRUNS_AGENT_MODULES = env_str("AGENTRUNS_AGENT_MODULES", "")  # extra modules that register agents
AGENTRUNS_FAILPOINT_DIR = env_str("AGENTRUNS_FAILPOINT_DIR", str(BASE_DIR / "var" / "failpoints"))
AGENTRUNS_STREAM_POLL_SECONDS = env_float("AGENTRUNS_STREAM_POLL_SECONDS", 0.25)
AGENTRUNS_WORKER_STALE_SECONDS = env_float("AGENTRUNS_WORKER_STALE_SECONDS", 30)
AGENTRUNS_APPROVAL_EXPIRY_SECONDS = env_float("AGENTRUNS_APPROVAL_EXPIRY_SECONDS", 0)  # 0: never
AGENTRUNS_APPROVER_LIMIT_CENTS = env_int("AGENTRUNS_APPROVER_LIMIT_CENTS", 0)  # 0: no limit
AGENTRUNS_METRICS_CACHE_SECONDS = env_float("AGENTRUNS_METRICS_CACHE_SECONDS", 5)
AGENTRUNS_METRICS_WINDOW = env_int("AGENTRUNS_METRICS_WINDOW", 10_000)  # attempts in the histogram

# --- the demo domain -----------------------------------------------------------------------
APP_BASE_URL = env_str("APP_BASE_URL", "http://127.0.0.1:8000")
REFUND_GATEWAY_URL = env_str("REFUND_GATEWAY_URL", APP_BASE_URL.rstrip("/") + "/gateway")
REFUND_GATEWAY_DELAY_MS = env_int("REFUND_GATEWAY_DELAY_MS", 0)
REFUND_GATEWAY_FAIL = env_bool("REFUND_GATEWAY_FAIL", False)
REFUND_GATEWAY_TIMEOUT_SECONDS = env_float("REFUND_GATEWAY_TIMEOUT_SECONDS", 10)
REFUND_APPROVAL_THRESHOLD_CENTS = env_int("REFUND_APPROVAL_THRESHOLD_CENTS", 0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "agentruns.runtime.redaction.RedactingFilter"}},
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
