from django.apps import AppConfig


class AgentRunsConfig(AppConfig):
    name = "agentruns"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Agents and tools are registered from each app's `agents.py`, like admin.py.
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("agents")
        # agents that live outside an installed app (benchmarks, scripts): a comma list
        from importlib import import_module

        from django.conf import settings

        for module in filter(None, settings.AGENTRUNS_AGENT_MODULES.split(",")):
            import_module(module.strip())
