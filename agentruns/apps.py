from importlib import import_module

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

from agentruns.conf import conf
from agentruns.registry.model_names import UnusableModel, check_model_name
from agentruns.runtime.dispatch import connections
from agentruns.setting import check_environment, connect_reload


class AgentRunsConfig(AppConfig):
    name = "agentruns"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        connect_reload()
        conf.load_all()  # a bad value stops every process at start-up, not mid-run
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
        for module in filter(None, conf.AGENT_MODULES.split(",")):
            import_module(module.strip())
        try:  # the default model's SDK must be installed (each agent's is checked as it registers)
            check_model_name(conf.MODEL)
        except UnusableModel as exc:
            raise ImproperlyConfigured(f"AGENTRUNS_MODEL: {exc}") from None


def _check_hook_secret() -> None:
    from agentruns.runtime.values.webhook_signatures import BadSecret, secret_bytes

    if conf.HOOK_SECRET:
        try:
            secret_bytes(conf.HOOK_SECRET)
        except BadSecret as exc:
            raise ImproperlyConfigured(f"AGENTRUNS_HOOK_SECRET: {exc}") from None
