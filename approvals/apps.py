from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


def webhook_settings_problems() -> list[str]:
    """What is wrong with AGENTRUNS_WEBHOOK_* (empty: nothing)."""
    from approvals.conf import conf
    from approvals.notifications.outbox import EVENT_TYPES
    from approvals.notifications.signing import BadSecret, secret_bytes

    problems = []
    if conf.WEBHOOK_URL:
        if not conf.WEBHOOK_URL.startswith(("http://", "https://")):
            problems.append("AGENTRUNS_WEBHOOK_URL must be an http:// or https:// URL")
        if not conf.WEBHOOK_SECRET:
            problems.append("AGENTRUNS_WEBHOOK_URL is set but AGENTRUNS_WEBHOOK_SECRET is not")
    if conf.WEBHOOK_SECRET:
        try:
            secret_bytes(conf.WEBHOOK_SECRET)
        except BadSecret as exc:
            problems.append(f"AGENTRUNS_WEBHOOK_SECRET: {exc}")
    unknown = [
        e.strip()
        for e in conf.WEBHOOK_EVENTS.split(",")
        if e.strip() and e.strip() not in EVENT_TYPES
    ]
    if unknown:
        problems.append(
            f"AGENTRUNS_WEBHOOK_EVENTS: unknown {', '.join(unknown)} (known: {', '.join(EVENT_TYPES)})"
        )
    return problems


def check_webhook_secret_strength(app_configs, **kwargs) -> list:
    from approvals.conf import conf
    from approvals.notifications.signing import (
        RECOMMENDED_SECRET_BYTES,
        BadSecret,
        secret_bytes,
    )

    try:
        key = secret_bytes(conf.WEBHOOK_SECRET) if conf.WEBHOOK_SECRET else None
    except BadSecret:
        return []  # refused at start-up already
    if key is not None and len(key) < RECOMMENDED_SECRET_BYTES:
        return [
            checks.Warning(
                f"AGENTRUNS_WEBHOOK_SECRET has {len(key)} bytes; Standard Webhooks asks for at "
                f"least {RECOMMENDED_SECRET_BYTES} random bytes",
                id="approvals.W001",
            )
        ]
    return []


class ApprovalsConfig(AppConfig):
    name = "approvals"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # imports inside: apps are not ready when this module is imported
        from approvals.conf import conf

        conf.load_all()  # a bad value stops every process at start-up
        problems = webhook_settings_problems()
        if problems:
            raise ImproperlyConfigured("; ".join(problems))
        checks.register(check_webhook_secret_strength)
        # the runtime's inbox port (agentruns/runtime/inbox.py): this app is its inbox
        from agentruns.runtime.inbox import register
        from approvals.inbox import ApprovalInbox

        register(ApprovalInbox())
