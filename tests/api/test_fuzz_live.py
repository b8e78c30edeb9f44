"""Schemathesis over every operation of /api/openapi.json, against the live ASGI server.

daphne + a real worker on the test PostgreSQL (tests/procs.py), bearer auth, every check
schemathesis has that applies to a single-tenant API: no 5xx, status codes, content types and
bodies as the description says, refusals of invalid data, links followed (runs created, then
read, cancelled, retried, forked; approvals listed, then decided). Afterwards no run is stuck:
each one ends or waits for a person. The example budget is small (FUZZ_EXAMPLES, per
operation and phase) so the suite's wall time stays in check; raise it to search harder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentruns.models import Run, RunStatus
from agentruns.services import start_run
from agentruns.tokens import create_token
from approvals.models import Approval
from tests.procs import ROOT, start_web, start_worker, wait_until

ARTIFACTS = ROOT / "var" / "test-artifacts" / "schemathesis"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "12"))
# a person must act on these; anything else must end by itself
SETTLED = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.WAITING}
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "missing_required_header",
        "unsupported_method",
        "allow_header_conformance",
        "ignored_auth",
    ]
)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_every_operation_survives_schemathesis(tmp_path: Path, seeded, django_user_model):
    # every refund parks for approval, so there are approvals to list and decide
    env = {"REFUND_APPROVAL_THRESHOLD_CENTS": 0}
    web, url = start_web(tmp_path, **env)
    worker = start_worker(tmp_path, **env)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        lead = django_user_model.objects.get(username="lead")  # seed_demo's
        token = create_token(lead)
        for order in ("ORD-1001", "ORD-1002", "ORD-1003"):
            start_run("refund", {"order_id": order, "message": "broken"}, user=lead)
        wait_until(lambda: Approval.objects.count() == 3, timeout=60, message="three approvals")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(Path(__file__).with_name("schemathesis.toml")),
                "run",
                f"{url}/api/openapi.json",
                "--url",
                url,
                "-H",
                f"Authorization: Bearer {token}",
                "--checks",
                CHECKS,
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--max-examples",
                str(EXAMPLES),
                "--seed",
                os.environ.get("AGENTRUNS_FUZZ_SEED", "1515"),
                "--workers",
                "1",
                "--request-timeout",
                "30",
                "--suppress-health-check",
                "all",
                "--report",
                "junit",
                "--report-dir",
                str(ARTIFACTS),
                "--output-sanitize",
                "true",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"},
        )
        (ARTIFACTS / "output.txt").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-3000:]
        assert "Internal Server Error" not in web.log(), web.log()

        # nothing left half-done: every run ends or waits for a person
        def settled() -> bool:
            # a refund run queued in its order's line (one run per order) waits for the run
            # ahead of it; that line must end at a run that waits for a person (below)
            unsettled = Run.objects.exclude(status__in=SETTLED)
            return not unsettled.filter(waiting_behind__isnull=True).exists()

        wait_until(settled, timeout=120, message="every fuzzed run to settle")
        for queued in Run.objects.exclude(status__in=SETTLED):
            ahead = queued
            for _ in range(Run.objects.count()):
                if ahead.waiting_behind is None:
                    break
                ahead = Run.objects.get(id=ahead.waiting_behind)
            assert ahead.holds_key and ahead.status == RunStatus.WAITING, (queued.id, ahead.id)
        assert Run.objects.count() > 0, "the fuzzer never created a run"
    finally:
        worker.kill()
        web.kill()
