"""The inbox's settings (the approvals app's), typed and read once like the runtime's
(`agentruns/conf.py`): the expiry, claims and escalation of items, and the notifications
(signed webhooks from the outbox, batched email). Their variables keep the `AGENTRUNS_` prefix
they always had. An approver's per-call limit stays with the runtime, which freezes it into
each run's permission snapshot; the per-day total is checked here, at each decision."""

from __future__ import annotations

from agentruns.setting import Conf, Setting

SETTINGS = (
    Setting(
        "AGENTRUNS_APPROVAL_EXPIRY_SECONDS", float, 0, "pending approvals expire (0: never)", 0
    ),
    Setting(
        "AGENTRUNS_APPROVER_DAILY_LIMIT_CENTS",
        int,
        0,
        "what one approver may approve in all per day, in the tools' amount_arg (0: off)",
        0,
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
        "APP_BASE_URL",
        str,
        "",
        "the site's own address (`https://support.example.com`): links in mails and webhooks "
        "(empty: paths only)",
    ),
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
)

conf = Conf(SETTINGS)
