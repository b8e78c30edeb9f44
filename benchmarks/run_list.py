"""One-off measurement: the runs list, run search, navigation and /metrics at 100,000 runs.

    scripts/with-postgres.sh .venv/bin/python -m benchmarks.run_list [--runs 100000]

Migrates a throwaway database, bulk-inserts runs (status mix of a busy support team, three
agents, 30 days of history, "ORD-n T-n" search keys) with two tool steps and attempts each, runs
ANALYZE, then times each page in-process with Django's test client (median and p95 of repeated
requests) and prints the queries per page and the plan of the main list query. Not a test: the
numbers depend on the machine; tests assert query counts, never times.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
import uuid
from datetime import timedelta


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.utils import timezone

    from agentruns.models import Run, Step, StepAttempt
    from agentruns.selectors.run_list import RunFilters, run_page

    setup_test_environment()
    call_command("migrate", verbosity=0)
    rng = random.Random(5)
    now = timezone.now()
    statuses = (
        ["succeeded"] * 80
        + ["failed"] * 10
        + ["waiting"] * 4
        + ["cancelled"] * 4
        + ["running", "queued"]
    )
    agents = ["refund", "refund", "triage", "billing"]
    Run._meta.get_field("created_at").auto_now_add = False  # keep our spread of history
    Step._meta.get_field("created_at").auto_now_add = False

    started = time.perf_counter()
    batch = 5_000
    target_run = None
    for first in range(0, args.runs, batch):
        runs, steps, attempts = [], [], []
        for i in range(first, min(first + batch, args.runs)):
            created = now - timedelta(seconds=rng.uniform(0, 30 * 86400))
            status = rng.choice(statuses)
            run = Run(
                id=uuid.uuid4(),
                agent=rng.choice(agents),
                status=status,
                input={"order_id": f"ORD-{i}"},
                search_text=f"ORD-{i} T-{i}",
                created_at=created,
                step_count=2,
                error="step #1 issue_refund failed: gateway answered 503"
                if status == "failed"
                else "",
            )
            runs.append(run)
            for index in range(2):
                step = Step(
                    id=uuid.uuid4(),
                    run=run,
                    index=index,
                    kind="tool",
                    tool="issue_refund",
                    idempotency_key=uuid.uuid4().hex,
                    created_at=created,
                    status="failed" if status == "failed" and index == 1 else "succeeded",
                    attempts=1,
                )
                steps.append(step)
                attempts.append(
                    StepAttempt(
                        step=step,
                        number=1,
                        worker="bench",
                        started_at=created,
                        finished_at=created + timedelta(milliseconds=rng.expovariate(1 / 120)),
                        outcome="failed" if step.status == "failed" else "succeeded",
                    )
                )
        Run.objects.bulk_create(runs)
        Step.objects.bulk_create(steps)
        StepAttempt.objects.bulk_create(attempts)
        target_run = target_run or runs[len(runs) // 2]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(
        f"inserted {args.runs} runs, {2 * args.runs} steps and attempts in {time.perf_counter() - started:.1f} s"
    )

    user = get_user_model().objects.create_superuser("bench", password="bench-pw-1")
    client = Client()
    client.force_login(user)

    deep_cursor = ""
    filters = RunFilters()
    for _ in range(40):  # 40 pages deep = 2,000 rows in
        deep_cursor = run_page(filters, older=deep_cursor).older or ""

    middle = target_run.search_text.split()
    urls = {
        "first page": "/runs/",
        "status=failed": "/runs/?status=failed",
        "agent=triage&age=24h": "/runs/?agent=triage&age=24h",
        "page 41 (keyset)": f"/runs/?older={deep_cursor}",
        f"search order {middle[0]}": f"/runs/?q={middle[0]}",
        f"search ticket {middle[1]}": f"/runs/?q={middle[1]}",
        "search run id prefix (8)": f"/runs/?q={str(target_run.id)[:8]}",
        "search, no match": "/runs/?q=ORD-NOPE",
        "run detail": f"/runs/{target_run.id}/",
        "/metrics (uncached)": "/metrics",
        "/healthz": "/healthz",
    }
    from django.conf import settings

    settings.AGENTRUNS_METRICS_CACHE_SECONDS = 0
    logging.getLogger("django.request").setLevel(logging.CRITICAL)  # /healthz 503: no worker here
    slowest: dict[str, tuple[float, str]] = {}
    print(f"\n{'page':32} {'queries':>7} {'median ms':>10} {'p95 ms':>8}")
    for label, url in urls.items():
        client.get(url)  # warm
        log: list[tuple[float, str]] = []

        def timed(execute, sql, params, many, context, log=log):
            t0 = time.perf_counter()
            try:
                return execute(sql, params, many, context)
            finally:
                log.append(((time.perf_counter() - t0) * 1000, sql))

        with connection.execute_wrapper(timed):
            client.get(url)
        slowest[label] = max(log) if log else (0.0, "")
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code in (200, 503), (url, response.status_code)
        p95 = statistics.quantiles(times, n=20)[-1]
        print(f"{label:32} {len(log):>7} {statistics.median(times):>10.1f} {p95:>8.1f}")
    print("\nslowest query per page:")
    for label, (took, sql) in slowest.items():
        print(f"  {label:32} {took:7.1f} ms  {sql[:110]}")

    print("\nplans:")
    from agentruns.selectors.pagination import decode_cursor, parse_uuid
    from agentruns.selectors.run_list import filtered_runs

    at, run_id = decode_cursor(deep_cursor, parse_uuid)
    from django.db.models import Q

    plans = {
        "page 41": filtered_runs(RunFilters())
        .filter(created_at__lte=at)
        .filter(Q(created_at__lt=at) | Q(id__lt=run_id))
        .order_by("-created_at", "-id")[:51],
        "status=failed": filtered_runs(RunFilters(status="failed")).order_by("-created_at", "-id")[
            :51
        ],
        "search ticket": filtered_runs(RunFilters(q=middle[1])).order_by("-created_at", "-id")[:51],
    }
    for label, qs in plans.items():
        print(f"--- {label}")
        print(qs.explain(analyze=True))


if __name__ == "__main__":
    main()
