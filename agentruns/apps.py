from importlib import import_module
from importlib.util import find_spec
from typing import Any

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from agentruns.conf import conf
from agentruns.installation import defaults
from agentruns.registry.model_names import UnusableModel, check_model_name
from agentruns.runtime.dispatch import connections
from agentruns.setting import check_environment, connect_reload


class AgentRunsConfig(AppConfig):
    name = "agentruns"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        # other libraries' settings the project left out (Q_CLUSTER, CHANNEL_LAYERS, ...), set
        # before any app's ready() reads them
        defaults.apply()

    def ready(self) -> None:
        connect_reload()
        conf.load_all()  # a bad value stops every process at start-up, not mid-run
        from agentruns.installation import checks  # noqa: F401  (registers them)

        use_our_qcluster()
        _check_hook_secret()
        check_environment()
        # django-q2 forks workers from processes that hold pooled connections
        connections.guard_forks()
        # OpenTelemetry from the standard OTEL_* variables (nothing at all when they are unset)
        from agentruns.runtime import tracing

        tracing.configure(instrument_libraries=conf.TRACE_LIBRARIES)
        # Agents and tools are registered from each app's `agents.py`, like admin.py, and from
        # the modules named by AGENTRUNS_AGENT_MODULES (benchmarks, scripts)
        # each agent is prepared for the engine as it registers (its durability capability)
        from agentruns.registry import on_register
        from agentruns.runtime.engine.agents import prepare
        from agentruns.runtime.waits.tools import install

        on_register(prepare)
        install()  # how tool code's waits are kept (registry.wait_for_event, the sleeps)
        autodiscover_modules("agents")
        for module in filter(None, (m.strip() for m in conf.AGENT_MODULES.split(","))):
            if find_spec_or_none(module) is not None:  # else `manage.py check` names it (E108)
                import_module(module)
        try:  # the default model's SDK must be installed (each agent's is checked as it registers)
            check_model_name(conf.MODEL)
        except UnusableModel as exc:
            raise ImproperlyConfigured(f"AGENTRUNS_MODEL: {exc}") from None


def find_spec_or_none(module: str) -> Any:
    try:
        return find_spec(module)
    except (ImportError, ValueError):
        return None


def use_our_qcluster() -> None:
    """`manage.py qcluster` is django-q2's command with the sweeper, the delivery loop and the
    run claimers (agentruns/management/commands/qcluster.py). Django runs the command of the
    app listed first, and projects list django_q before agentruns: django-q2's module hands out
    ours."""
    from django_q.management.commands import qcluster as q2_qcluster

    from agentruns.management.commands.qcluster import Command

    q2_qcluster.Command = Command


def _check_hook_secret() -> None:
    from agentruns.runtime.values.webhook_signatures import BadSecret, secret_bytes

    if conf.HOOK_SECRET:
        try:
            secret_bytes(conf.HOOK_SECRET)
        except BadSecret as exc:
            raise ImproperlyConfigured(f"AGENTRUNS_HOOK_SECRET: {exc}") from None
