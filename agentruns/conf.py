"""Every runtime setting, declared once: name, type, default and what it is for (DESIGN.md 7).

`conf.LEASE_TTL_SECONDS` reads `AGENTRUNS_LEASE_TTL_SECONDS` (how a value is found and parsed,
and why a typo fails loudly: `agentruns/setting.py`). README's settings table lists them all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.core.exceptions import ImproperlyConfigured

from agentruns.setting import Conf, Setting


@dataclass(frozen=True)
class ModelLimit:
    """A model provider's rate limit for one model name (runtime/access/model_limits.py)."""

    rpm: int = 0  # requests a minute (0: not limited)
    tpm: int = 0  # tokens a minute (0: not limited)


def parse_model_limits(name: str, raw: Any) -> dict[str, ModelLimit]:
    """`{"<model name>": {"rpm": 60, "tpm": 90000}, ...}` (JSON, or that dict in a settings
    module) -> {model name: ModelLimit}; anything else is ImproperlyConfigured, naming it."""
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            f'{name} must be a JSON object: {{"<model name>": {{"rpm": 60, "tpm": 90000}}}}'
        )
    limits: dict[str, ModelLimit] = {}
    for model, limit in raw.items():
        where = f"{name}[{model!r}]"
        if not isinstance(model, str) or not model.strip():
            raise ImproperlyConfigured(f"{name}: a model name must be a non-empty string")
        if not isinstance(limit, dict) or not limit:
            raise ImproperlyConfigured(f'{where} must be an object like {{"rpm": 60}}')
        unknown = sorted(set(limit) - {"rpm", "tpm"})
        if unknown:
            raise ImproperlyConfigured(f"{where}: unknown key(s) {unknown}; use rpm and tpm")
        for key, value in limit.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ImproperlyConfigured(f"{where}.{key}={value!r} is not a positive integer")
        limits[model] = ModelLimit(**limit)
    return limits


# a token's lifetime in days, at most (ten years; 0 is a token that never expires)
API_TOKEN_MAX_DAYS = 3650

SETTINGS: tuple[Setting, ...] = (
    # the model
    Setting(
        "AGENTRUNS_MODEL",
        str,
        "scripted",
        "`scripted` (offline), `openai/<model name>` or a Pydantic AI model name (`anthropic:...`)",
    ),
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
        "AGENTRUNS_TOOL_OUTAGE_SECONDS",
        float,
        600,
        "an MCP server refusing connections, not starting or answering 429/503 is waited for "
        "this long (the model's backoff, no tool attempt used) before the step fails",
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
    Setting(
        "AGENTRUNS_MODEL_LIMITS",
        str,
        "",
        'the providers\' rate limits, kept before each request: {"<model name>": {"rpm": 60, '
        '"tpm": 90000}} (JSON; the name as the run\'s model says it)',
        parser=parse_model_limits,
    ),
    Setting(
        "AGENTRUNS_MODEL_LIMIT_JITTER_SECONDS",
        float,
        0.25,
        "how late a request may reach the provider after its rate-limit slot with no second or "
        "minute over the limit there (a limit of a whole number a second is kept at "
        "1 / (1 + this) of it)",
        0,
    ),
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
        0,
        "a run executing this long re-enqueues itself (0: never; a run in flight is a task of its "
        "process's loop and holds no thread, so a time slice only costs; the next slice starts at "
        "the run's resume point; a draining process still hands its runs over)",
        0,
    ),
    Setting(
        "AGENTRUNS_RUNS_PER_PROCESS",
        int,
        lambda: _runs_per_process_default(),
        "runs executing at once in each worker process (default: 500 on PostgreSQL, 16 on SQLite)",
        1,
    ),
    Setting(
        "AGENTRUNS_DB_THREADS",
        int,
        4,
        "threads per worker process doing its runs' database work (the engine's commits and "
        "reads, transactional tools); each keeps a pooled connection while work waits for it",
        1,
    ),
    Setting(
        "AGENTRUNS_TOOL_THREADS",
        int,
        32,
        "threads per worker process running its runs' sync functions (a `def` tool, a sync "
        "instructions function): calls at once that wait on the world, no connection held",
        1,
    ),
    Setting(
        "AGENTRUNS_RUN_CLAIM_BATCH",
        int,
        50,
        "PostgreSQL: each worker process claims up to this many queued runs per statement, woken "
        "by the start's NOTIFY (0: starts ring a q2 doorbell each, as on SQLite)",
        0,
    ),
    Setting(
        "AGENTRUNS_RUN_CLAIM_POLL_SECONDS",
        float,
        1,
        "a worker's claimer with free slots looks for queued runs this often without a NOTIFY",
        0.05,
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
    Setting(
        "AGENTRUNS_RETENTION_DAYS",
        float,
        0,
        "the worker deletes finished runs (their steps, events, inbox items) older than this, "
        "hourly (0: never)",
        0,
    ),
    # the web
    Setting(
        "WEB_DB_POOL_TIMEOUT",
        float,
        3,
        "the web's wait for a pooled database connection (agentruns.asgi applies it to its own "
        "process): during an outage a request answers 503 within seconds",
        0.1,
    ),
    Setting(
        "WEB_REQUESTS_AT_ONCE",
        int,
        8,
        "requests a web process handles at once (until a streamed body starts); the rest wait "
        "their turn in its event loop: keep it below the database pool's max size",
        1,
    ),
    Setting(
        "WEB_QUEUE_SECONDS",
        float,
        10,
        "... the longest a request waits for its turn before a 503 with Retry-After",
        0.1,
    ),
    # streaming
    Setting("REDIS_URL", str, "", "channels_redis for the stream (unset: in-memory layer + poll)"),
    Setting(
        "AGENTRUNS_STREAM_POLL_SECONDS",
        float,
        0.25,
        "database poll of the stream (covers lost nudges)",
        0.01,
    ),
    # approvers' limits, frozen into each run's permission snapshot (the inbox's own settings:
    # approvals/conf.py)
    Setting(
        "AGENTRUNS_APPROVER_LIMIT_CENTS", int, 0, "approvals above it need a superuser (0: none)", 0
    ),
    # the API
    Setting("AGENTRUNS_API_MAX_BODY_BYTES", int, 1_000_000, "larger request bodies get 413", 1024),
    Setting(
        "AGENTRUNS_API_TOKEN_DAYS",
        float,
        90,
        "new API tokens expire after it (0: never)",
        0,
        maximum=API_TOKEN_MAX_DAYS,
    ),
    # quotas (per user; 0 turns one off): runtime/access/quotas.py, stream/access/slots.py
    Setting("AGENTRUNS_START_BURST", int, 100, "runs a user may start at once (token bucket)", 0),
    Setting("AGENTRUNS_START_PER_SECOND", float, 10, "... refilled at this rate", 0),
    Setting("AGENTRUNS_RUNS_IN_FLIGHT_PER_USER", int, 200, "queued + running runs per user", 0),
    Setting("AGENTRUNS_DECISION_BURST", int, 200, "decisions at once (a bulk: each item)", 0),
    Setting("AGENTRUNS_DECISION_PER_SECOND", float, 2, "... refilled at this rate", 0),
    # every door that acts counts its refusals too (a guessed hook token, a refused post)
    Setting("AGENTRUNS_HOOK_BURST", int, 30, "hook resolutions per sender at once", 0),
    Setting("AGENTRUNS_HOOK_PER_SECOND", float, 3, "... refilled at this rate", 0),
    Setting("AGENTRUNS_HOOK_PROCESS_BURST", int, 300, "hook resolutions per web process", 0),
    Setting("AGENTRUNS_HOOK_PROCESS_PER_SECOND", float, 30, "... refilled at this rate", 0),
    Setting("AGENTRUNS_ACTION_BURST", int, 100, "thread posts, and stops, per user at once", 0),
    Setting("AGENTRUNS_ACTION_PER_SECOND", float, 10, "... refilled at this rate", 0),
    Setting("AGENTRUNS_INPUT_MAX_KEY_BYTES", int, 20_000, "a run input's value, as JSON", 0),
    Setting("AGENTRUNS_SOCKETS_PER_USER", int, 50, "streams per user and web process", 0),
    Setting("AGENTRUNS_SOCKETS_PER_PROCESS", int, 5000, "streams (sockets, SSE) per process", 0),
    # operations
    Setting("AGENTRUNS_WORKER_STALE_SECONDS", float, 30, "/healthz turns 503 past it", 1),
    Setting(
        "AGENTRUNS_METRICS_CACHE_SECONDS", float, 5, "/metrics is computed at most this often", 0
    ),
    Setting("AGENTRUNS_METRICS_WINDOW", int, 10_000, "step attempts in the duration histogram", 1),
    Setting("AGENTRUNS_METRICS_TOKEN", str, "", "a bearer token that may read /metrics"),
    Setting(
        "AGENTRUNS_HOOK_SECRET",
        str,
        "",
        "`whsec_<base64>`: machine senders of `POST /api/hooks/<token>` sign with it (Standard "
        "Webhooks; checked at start-up); empty: only bearer tokens with `agentruns.resolve_hook`",
    ),
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
    # a run in flight is a task of the process's loop waiting on the model (a few KB, no thread,
    # no connection): 500 per process carry 1000 runs on the default two worker processes
    # (docs/BENCHMARKS.md); SQLite serialises every writer, so fewer runs at once keep its lock
    # queue short (measurements: docs/BENCHMARKS.md, "Choosing the defaults")
    engine = settings.DATABASES["default"]["ENGINE"]
    return 500 if "postgresql" in engine else 16


def _base_dir() -> Any:
    return settings.BASE_DIR


conf = Conf(SETTINGS)


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
