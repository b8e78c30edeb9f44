"""The demo's settings (REFUND_*), typed and read once like the runtime's (agentruns/conf.py)."""

from __future__ import annotations

from django.conf import settings

from agentruns.setting import Conf, Setting


def _gateway_url() -> str:
    return settings.APP_BASE_URL.rstrip("/") + "/gateway"


demo_conf = Conf(
    (
        Setting("REFUND_GATEWAY_URL", str, _gateway_url, "where `issue_refund` sends refunds"),
        Setting(
            "REFUND_GATEWAY_KEY",
            str,
            "",
            "the gateway requires `Authorization: Bearer <it>`; `issue_refund` sends it (empty: open)",
        ),
        Setting("REFUND_GATEWAY_DELAY_MS", int, 0, "the gateway's simulated latency", 0),
        Setting("REFUND_GATEWAY_FAIL", bool, False, "the gateway answers 503 to every refund"),
        Setting("REFUND_GATEWAY_TIMEOUT_SECONDS", float, 10, "the tool's HTTP timeout", 0.1),
        Setting("REFUND_APPROVAL_THRESHOLD_CENTS", int, 0, "refunds above it need approval", 0),
        Setting(
            "REFUND_RUNS_PER_ORDER",
            int,
            1,
            "refund runs of one order at a time, the others wait in line (0: no line)",
            0,
        ),
        Setting(
            "REFUND_TWO_PERSON_CENTS",
            int,
            0,
            "refunds above it need two approvers, neither the run's starter (0: off)",
            0,
        ),
    ),
    prefix="REFUND_",
)
