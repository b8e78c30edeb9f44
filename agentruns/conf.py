"""Every runtime setting, typed, read once (DESIGN.md 7).

`conf.LEASE_TTL_SECONDS` reads `AGENTRUNS_LEASE_TTL_SECONDS` from Django's settings when a
settings module (or a test) defines it, else from the environment, else the default below; the
value is parsed once per process (again after a test changes a setting) and a value that cannot
be parsed raises `ImproperlyConfigured` naming the variable. A misspelt attribute is an
`AttributeError`, and an `AGENTRUNS_*` environment variable nobody reads fails the start-up
check (`check_environment`), so a typo never silently means "the default". The `env_*`
parsers are the ones `config/settings.py` uses for Django's own settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# importing django.conf is safe from config/settings.py: only attribute access loads settings
from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

PREFIX = "AGENTRUNS_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


# ------------------------------------------------------------------ parsers
def parse_bool(name: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)"
    )


def parse_int(name: str, raw: Any) -> int:
    if isinstance(raw, bool):
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer")
    if isinstance(raw, int):
        return raw
    try:
        return int(str(raw).strip().replace("_", ""))
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None


def parse_float(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number")
    try:
        value = float(raw if isinstance(raw, int | float) else str(raw).strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    return value


def parse_str(name: str, raw: Any) -> str:
    return str(raw)


_PARSERS: dict[type, Callable[[str, Any], Any]] = {
    bool: parse_bool,
    int: parse_int,
    float: parse_float,
    str: parse_str,
}


def _env(name: str) -> str | None:
    raw = os.environ.get(name)
    return None if raw is None or raw == "" else raw


def env_str(name: str, default: str = "") -> str:
    raw = _env(name)
    return default if raw is None else raw


def env_bool(name: str, default: bool = False) -> bool:
    raw = _env(name)
    return default if raw is None else parse_bool(name, raw)


def env_int(name: str, default: int) -> int:
    raw = _env(name)
    return default if raw is None else parse_int(name, raw)


def env_float(name: str, default: float) -> float:
    raw = _env(name)
    return default if raw is None else parse_float(name, raw)


# ------------------------------------------------------------------ the settings
@dataclass(frozen=True)
class Setting:
    name: str  # the variable: a Django setting or an environment variable
    type: type
    default: Any  # a value, or a callable of no arguments (read when first needed)
    doc: str
    minimum: float | None = None

    def read(self) -> Any:
        raw = getattr(settings, self.name, None)
        if raw is None:
            raw = _env(self.name)
        if raw is None:
            raw = self.default() if callable(self.default) else self.default
        value = _PARSERS[self.type](self.name, raw)
        if self.minimum is not None and value < self.minimum:
            raise ImproperlyConfigured(f"{self.name}={raw!r} is below its minimum {self.minimum}")
        return value


def _q_timeout() -> float:
    return float(settings.Q_CLUSTER.get("timeout") or 120)


SETTINGS: tuple[Setting, ...] = (
    # the model
    Setting("AGENTRUNS_MODEL", str, "scripted", "`scripted` (offline) or `openai/<model name>`"),
    Setting("SCRIPTED_MODEL_DELAY_MS", float, 15, "per-token delay of the scripted model", 0),
    Setting(
        "SCRIPTED_MODEL_LATENCY_MS",
        float,
        0,
        "the scripted model's wait before the first token of every turn (a real model's latency)",
        0,
    ),
    Setting("OPENAI_BASE_URL", str, "https://api.openai.com/v1", "any OpenAI-compatible endpoint"),
    Setting("OPENAI_API_KEY", str, "", "its key (never logged)"),
    Setting("OPENAI_TIMEOUT_SECONDS", float, 60, "between bytes of a streamed answer", 0),
    Setting("OPENAI_MAX_RETRIES", int, 4, "the SDK's own retries inside one model attempt", 0),
    Setting(
        "AGENTRUNS_MODEL_OUTAGE_SECONDS",
        float,
        600,
        "a model endpoint refusing, timing out or answering 5xx/429 is backed off from this long "
        "before the step fails (retry picks it up)",
        0,
    ),
    Setting(
        "AGENTRUNS_MODEL_BACKOFF_SECONDS",
        float,
        0.5,
        "the first wait after a failed model call; it doubles per failure",
        0,
    ),
    Setting(
        "AGENTRUNS_MODEL_BACKOFF_MAX_SECONDS",
        float,
        30,
        "... up to this (a Retry-After longer than it is still honoured)",
        0,
    ),
    Setting(
        "AGENTRUNS_MODEL_MAX_ATTEMPTS",
        int,
        3,
        "attempts of a model step whose stream broke after text arrived (outages before any "
        "text are not attempts)",
        1,
    ),
    Setting(
        "OPENAI_REQUEST_OPTIONS", str, "", 'JSON merged into every request, e.g. {"temperature": 0}'
    ),
    Setting(
        "AGENTRUNS_MODEL_PRICES", str, "", '"gpt-4o-mini=0.15/0.60,...": USD per million tokens'
    ),
    Setting("AGENTRUNS_MAX_COST_USD", float, 0, "a run's cost budget (0: none)", 0),
    # execution
    Setting(
        "AGENTRUNS_LEASE_TTL_SECONDS",
        float,
        15,
        "run lease; a dead worker's run continues after it",
        0.1,
    ),
    Setting(
        "AGENTRUNS_SWEEP_INTERVAL_SECONDS",
        float,
        2,
        "the fast sweeper loop inside `qcluster`",
        0.05,
    ),
    Setting(
        "AGENTRUNS_SLICE_SECONDS",
        float,
        lambda: _q_timeout() / 2,
        "a run holding a worker this long re-enqueues itself (default: Q_TIMEOUT / 2)",
        0.1,
    ),
    Setting(
        "AGENTRUNS_RUNS_PER_PROCESS",
        int,
        lambda: _runs_per_process_default(),
        "runs executing at once in each worker process (default: 100 on PostgreSQL, 16 on SQLite)",
        1,
    ),
    Setting(
        "AGENTRUNS_DRAIN_SECONDS",
        float,
        20,
        "on SIGTERM or a q2 recycle: how long running steps may finish before leases are released",
        0,
    ),
    Setting(
        "AGENTRUNS_HANDOVER_WAIT_SECONDS",
        float,
        5,
        "a full worker process waits this long for a free slot, then gives the doorbell back "
        "(capped at a quarter of Q_TIMEOUT)",
        0,
    ),
    Setting(
        "AGENTRUNS_RETRY_SLEEP_MAX_SECONDS",
        float,
        1,
        "a retry backoff longer than this frees the run's slot (a delayed doorbell wakes it)",
        0,
    ),
    Setting(
        "AGENTRUNS_AGENT_MISSING_RETRY_SECONDS",
        float,
        30,
        "a run whose agent is not deployed in the worker waits this long, then looks again",
        0.1,
    ),
    Setting(
        "AGENTRUNS_DEFAULT_MAX_STEPS",
        int,
        25,
        "steps before a run stops (an agent may set its own)",
        1,
    ),
    Setting(
        "AGENTRUNS_DELTA_FLUSH_MS", float, 50, "model text is batched into events this often", 0
    ),
    Setting("AGENTRUNS_DELTA_FLUSH_CHARS", int, 200, "... or at this many characters", 1),
    Setting("AGENTRUNS_FAILPOINTS", str, "", "e.g. `tool_returned:issue_refund=crash_once`"),
    Setting(
        "AGENTRUNS_FAILPOINT_DIR",
        str,
        lambda: str(_base_dir() / "var" / "failpoints"),
        "where crash_once remembers what it crashed",
    ),
    Setting("AGENTRUNS_AGENT_MODULES", str, "", "extra modules that register agents (comma list)"),
    # streaming
    Setting("REDIS_URL", str, "", "channels_redis for the stream (unset: in-memory layer + poll)"),
    Setting(
        "AGENTRUNS_STREAM_POLL_SECONDS",
        float,
        0.25,
        "database poll of the stream (covers lost nudges)",
        0.01,
    ),
    # approvals
    Setting(
        "AGENTRUNS_APPROVAL_EXPIRY_SECONDS", float, 0, "pending approvals expire (0: never)", 0
    ),
    Setting(
        "AGENTRUNS_APPROVER_LIMIT_CENTS", int, 0, "approvals above it need a superuser (0: none)", 0
    ),
    Setting("AGENTRUNS_CLAIM_SECONDS", float, 900, 'an "I\'m on it" claim on an item expires', 1),
    Setting(
        "AGENTRUNS_APPROVAL_ESCALATE_SECONDS",
        float,
        0,
        "a pending item older than this escalates once (0: never; a tool may set its own)",
        0,
    ),
    Setting(
        "AGENTRUNS_ESCALATION_GROUP",
        str,
        "",
        "the group mailed about escalated items (empty: the superusers)",
    ),
    # notifications: signed webhooks from the outbox, batched email
    Setting("AGENTRUNS_WEBHOOK_URL", str, "", "the endpoint every event is sent to (empty: none)"),
    Setting("AGENTRUNS_WEBHOOK_SECRET", str, "", "its signing secret, `whsec_<base64>`"),
    Setting(
        "AGENTRUNS_WEBHOOK_EVENTS",
        str,
        "",
        "event types sent to AGENTRUNS_WEBHOOK_URL, comma list (empty: all)",
    ),
    Setting("AGENTRUNS_WEBHOOK_TIMEOUT_SECONDS", float, 15, "one delivery attempt", 0.05),
    Setting(
        "AGENTRUNS_WEBHOOK_MAX_ATTEMPTS",
        int,
        12,
        "tries before a delivery is marked failed (the default spans more than a day)",
        1,
    ),
    Setting(
        "AGENTRUNS_WEBHOOK_RETRY_BASE_SECONDS",
        float,
        5,
        "the first retry's delay; each next one is 4x longer (+-20% jitter)",
        0.01,
    ),
    Setting(
        "AGENTRUNS_WEBHOOK_RETRY_MAX_SECONDS",
        float,
        6 * 3600,
        "the longest delay between tries",
        0.01,
    ),
    Setting(
        "AGENTRUNS_WEBHOOK_POLL_SECONDS",
        float,
        1,
        "the worker's delivery loop looks this often",
        0.01,
    ),
    Setting("AGENTRUNS_WEBHOOK_CONCURRENCY", int, 4, "deliveries one worker sends at once", 1),
    Setting(
        "AGENTRUNS_APPROVAL_EMAILS", bool, True, "mail new and escalated items to who may decide"
    ),
    Setting(
        "AGENTRUNS_EMAIL_BATCH_SECONDS",
        float,
        60,
        "new items are collected this long into one mail per person",
        0,
    ),
    # the API
    Setting("AGENTRUNS_API_MAX_BODY_BYTES", int, 1_000_000, "larger request bodies get 413", 1024),
    Setting("AGENTRUNS_API_TOKEN_DAYS", float, 90, "new API tokens expire after it (0: never)", 0),
    # quotas (per user; 0 turns one off): runtime/quotas.py, stream/sockets.py
    Setting("AGENTRUNS_START_BURST", int, 100, "runs a user may start at once (token bucket)", 0),
    Setting("AGENTRUNS_START_PER_SECOND", float, 10, "... refilled at this rate", 0),
    Setting("AGENTRUNS_RUNS_IN_FLIGHT_PER_USER", int, 200, "queued + running runs per user", 0),
    Setting("AGENTRUNS_DECISION_BURST", int, 200, "decisions at once (a bulk: each item)", 0),
    Setting("AGENTRUNS_DECISION_PER_SECOND", float, 2, "... refilled at this rate", 0),
    Setting("AGENTRUNS_INPUT_MAX_KEY_BYTES", int, 20_000, "a run input's value, as JSON", 0),
    Setting("AGENTRUNS_SOCKETS_PER_USER", int, 50, "run sockets per user and web process", 0),
    Setting("AGENTRUNS_SOCKETS_PER_PROCESS", int, 5000, "run sockets per web process", 0),
    # operations
    Setting("AGENTRUNS_WORKER_STALE_SECONDS", float, 30, "/healthz turns 503 past it", 1),
    Setting(
        "AGENTRUNS_METRICS_CACHE_SECONDS", float, 5, "/metrics is computed at most this often", 0
    ),
    Setting("AGENTRUNS_METRICS_WINDOW", int, 10_000, "step attempts in the duration histogram", 1),
    Setting("AGENTRUNS_METRICS_TOKEN", str, "", "a bearer token that may read /metrics"),
    Setting(
        "AGENTRUNS_METRICS_ALLOW",
        str,
        "127.0.0.1,::1",
        "addresses that may read /metrics",
    ),
    Setting(
        "AGENTRUNS_TRACE_LIBRARIES",
        bool,
        False,
        "with OTEL_* tracing on: spans of Django's requests and psycopg's queries",
    ),
)


def _runs_per_process_default() -> int:
    # threads wait on the model without holding the process (100 runs at 500 ms per model turn
    # cost ~40% of a core); SQLite serialises every writer, so fewer runs at once keep its lock
    # queue short (measurements: docs/BENCHMARKS.md, "Choosing the defaults")
    engine = settings.DATABASES["default"]["ENGINE"]
    return 100 if "postgresql" in engine else 16


def _base_dir() -> Any:
    return settings.BASE_DIR


_ALL: list[Conf] = []


class Conf:
    """Attribute access by the name without its prefix: `conf.LEASE_TTL_SECONDS`."""

    def __init__(self, settings: tuple[Setting, ...], prefix: str = PREFIX) -> None:
        self._by_attr = {s.name.removeprefix(prefix): s for s in settings}
        self._values: dict[str, Any] = {}
        _ALL.append(self)

    def __getattr__(self, attr: str) -> Any:
        try:
            setting = self._by_attr[attr]
        except KeyError:
            raise AttributeError(
                f"no setting {attr!r} (known: {', '.join(sorted(self._by_attr))})"
            ) from None
        values = self.__dict__["_values"]
        if attr not in values:
            values[attr] = setting.read()
        return values[attr]

    def reload(self, **_: Any) -> None:
        self._values.clear()

    def load_all(self) -> None:
        """Parse every setting now, so a bad value stops the process at start-up."""
        for attr in self._by_attr:
            getattr(self, attr)

    def names(self) -> set[str]:
        return {s.name for s in self._by_attr.values()}


conf = Conf(SETTINGS)


def all_settings() -> list[Setting]:
    """Every setting of every Conf (the runtime's and the apps'), for docs and checks."""
    return [setting for each in _ALL for setting in each._by_attr.values()]


def check_environment() -> None:
    """Every `AGENTRUNS_*` variable in the environment must be one somebody reads."""
    known = set().union(*(c.names() for c in _ALL))
    unknown = sorted(k for k in os.environ if k.startswith(PREFIX) and k not in known)
    if unknown:
        raise ImproperlyConfigured(
            f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(k for k in known if k.startswith(PREFIX)))}"
        )


def _reload_on_change(*, setting: str, **_: Any) -> None:
    # tests change settings at run time (pytest-django's `settings` fixture): re-read everything
    for each in _ALL:
        each.reload()


def connect_reload() -> None:
    setting_changed.connect(_reload_on_change, dispatch_uid="agentruns.conf.reload")


# ------------------------------------------------------------------ the deploy check
@register(Tags.security, deploy=True)
def check_secret_key(app_configs: Any, **kwargs: Any) -> list[Error]:
    """Django's W009 accepts our built-in development key (it is long and varied): refuse it."""
    builtin = getattr(settings, "BUILTIN_SECRET_KEY", None)
    if builtin and settings.SECRET_KEY == builtin:
        return [
            Error(
                "SECRET_KEY is the built-in development key, which is public.",
                hint="Set SECRET_KEY in the environment to a long random value of your own.",
                id="agentruns.E001",
            )
        ]
    return []
