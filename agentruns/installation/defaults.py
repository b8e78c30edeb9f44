"""Settings of other libraries the apps need, defaulted in this one place when the project's
settings module leaves them out (a value the project set is never touched):

- `Q_CLUSTER`: django-q2 as a doorbell (`doorbell_cluster()`): the database lease decides who
  runs, q2 only wakes workers (../shared/notes/django-q2-measured.md);
- `CHANNEL_LAYERS`: channels_redis with `REDIS_URL`, else the in-memory layer (the stream's
  database poll covers what it cannot carry across processes);
- `ASGI_APPLICATION`: `agentruns.asgi.application` (daphne's `runserver` serves it).

`apply()` runs when the agentruns app is created (`AgentRunsConfig.__init__`), before any app's
`ready()` and before the admin imports django-q2's admin. django-q2 reads `Q_CLUSTER` once, into
`django_q.conf.Conf`, when its app is imported; a project lists `django_q` before `agentruns`,
so that has happened already, and `Conf` is read again from the defaulted setting.

A project that sets `Q_CLUSTER` itself (it runs q2 tasks of its own) starts from
`doorbell_cluster()` in its settings module and changes what it must:

    from agentruns.installation.defaults import doorbell_cluster
    Q_CLUSTER = doorbell_cluster(workers=4)

`manage.py check` says which of its keys the apps cannot do without (`checks.py`).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings

from agentruns.setting import env_float, env_int, env_str

DOORBELL_BROKER = "agentruns.runtime.dispatch.broker.DoorbellBroker"
ASGI_ENTRY = "agentruns.asgi.application"


def doorbell_cluster(**overrides: Any) -> dict[str, Any]:
    """django-q2's settings for a doorbell design, from the environment (`Q_WORKERS`,
    `Q_TIMEOUT`, `Q_RETRY`, `Q_POLL`, `Q_RECYCLE`, `Q_MAX_RSS`, `Q_CLUSTER_NAME`), with
    `overrides` on top. Reads no Django setting, so a settings module may call it."""
    workers = env_int("Q_WORKERS", 2)
    timeout = env_int("Q_TIMEOUT", 120)
    cluster = {
        "name": env_str("Q_CLUSTER_NAME", "agentruns"),
        "orm": "default",
        # the ORM broker, first in first out, with delayed doorbells (a retry backoff)
        "broker_class": DOORBELL_BROKER,
        "workers": workers,
        "timeout": timeout,
        # well above the timeout: a doorbell taken off the queue is redelivered after `retry`
        "retry": env_int("Q_RETRY", timeout * 3 + 60),
        "queue_limit": workers,  # prefetched doorbells count their wait against `retry`
        "bulk": 1,
        "poll": env_float("Q_POLL", 0.1),
        "ack_failures": True,  # a failed doorbell is not rung again forever
        "max_attempts": 1,
        "save_limit": -1,  # results live in the apps' own tables
        "catch_up": False,
        "label": "Task queue",
        # a q2 task only hands its run (and the doorbells queued behind it) to the process's
        # executor pool and returns, so `recycle` counts q2 tasks, not runs; a recycled process
        # lets its runs finish (AGENTRUNS_DRAIN_SECONDS) before it exits
        "recycle": env_int("Q_RECYCLE", 5000),
        "max_rss": env_int("Q_MAX_RSS", 0) or None,  # KiB
    }
    cluster.update(overrides)
    return cluster


def channel_layers() -> dict[str, Any]:
    """channels_redis with REDIS_URL set, else the in-memory layer (one process's nudges; the
    stream's database poll carries the rest)."""
    from agentruns.conf import conf

    redis_url = conf.REDIS_URL
    if redis_url:
        return {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                "CONFIG": {"hosts": [redis_url]},
            }
        }
    return {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


LIBRARY_DEFAULTS: dict[str, Callable[[], Any]] = {
    "Q_CLUSTER": doorbell_cluster,
    "CHANNEL_LAYERS": channel_layers,
    "ASGI_APPLICATION": lambda: ASGI_ENTRY,
}


def apply() -> list[str]:
    """Set each of LIBRARY_DEFAULTS the project's settings leave out; the names set."""
    applied = []
    for name, default in LIBRARY_DEFAULTS.items():
        if not hasattr(settings, name):
            setattr(settings, name, default())
            applied.append(name)
    if "Q_CLUSTER" in applied:
        reread_q2_conf()
    return applied


def reread_q2_conf() -> None:
    """django-q2 copies `Q_CLUSTER` into the attributes of `django_q.conf.Conf` when that module
    is imported. If it has been, build the class again from the settings as they are now (a
    private copy of the module, executed afresh) and give the original class its attributes, so
    every q2 module that holds `Conf` sees them; if not, q2 reads the settings when it imports."""
    module = sys.modules.get("django_q.conf")
    if module is None:
        return
    spec = importlib.util.spec_from_file_location("agentruns._q2_conf_reread", module.__file__)
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    for name, value in vars(fresh.Conf).items():
        if not name.startswith("__"):
            setattr(module.Conf, name, value)
    module.error_reporter = fresh.error_reporter
