"""The run page in a real Chromium through a PostgreSQL outage: daphne, a real worker and a
PostgreSQL server of the test's own, which the test stops mid-run.

While the database is down the page's socket is closed with 4503 ("try again later") and every
reconnect is refused the same way: the page must say "reconnecting". Once the server is back
(and a worker continues the run: the one running it was killed before the outage, so the drill
tests the page, not the worker's own weathering) the page carries on by itself from its cursor:
at the end every model turn is on the page once, every event once and in order, and the output
is the run's, all compared with what the database holds. The inbox, open beside it, says
"reconnecting" while its poll fails and carries on by itself afterwards.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.kit import PASSWORD, WAIT_MS, browser_marks, logged_in_page
from tests.e2e.test_run_page import RECORDER
from tests.pgserver import PrivatePostgres
from tests.procs import start_run_over_http, start_web, start_worker

pytestmark = [m for m in browser_marks() if m.name != "django_db"]


@pytest.fixture
def private_pg():
    pg = PrivatePostgres("page-outage")
    pg.start()
    pg.create_database()
    yield pg
    pg.close()


def database_truth(pg: PrivatePostgres, run_id: str) -> dict:
    with pg.connect() as conn:
        status, output, last_seq = conn.execute(
            "SELECT status, output, last_seq FROM agentruns_run WHERE id = %s", (run_id,)
        ).fetchone()
        texts = [
            row[0]
            for row in conn.execute(
                "SELECT text FROM agentruns_step WHERE run_id = %s AND kind = 'model'"
                " ORDER BY index",
                (run_id,),
            )
        ]
        listed = [
            row[0]
            for row in conn.execute(
                "SELECT seq FROM agentruns_runevent WHERE run_id = %s AND type <> 'model.delta'"
                " ORDER BY seq",
                (run_id,),
            )
        ]
    return {
        "status": status,
        "output": output,
        "last_seq": last_seq,
        "texts": texts,
        "listed": listed,
    }


def test_run_page_says_reconnecting_through_a_database_outage_and_misses_nothing(
    tmp_path, browser, private_pg
):
    pg = private_pg
    env = {
        "DATABASE_URL": pg.url,
        "SCRIPTED_MODEL_DELAY_MS": "60",
        "REFUND_APPROVAL_THRESHOLD_CENTS": "1000000000",
        "AGENTRUNS_STREAM_POLL_SECONDS": "0.1",
    }
    pg.migrate()
    pg.set_password("lead", PASSWORD)
    token = pg.lead_token
    web, base_url = start_web(tmp_path, **env)
    env["REFUND_GATEWAY_URL"] = base_url + "/gateway"
    workers = [start_worker(tmp_path, name="worker-1", **env)]
    try:
        page = logged_in_page(browser, base_url, "lead", RECORDER)
        inbox = logged_in_page(browser, base_url, "lead", "", next_path="/approvals/")
        assert inbox.get_attribute("#inbox-conn", "data-state") == "live"
        run_id = start_run_over_http(
            base_url, token, {"order_id": "ORD-1009", "message": "It never worked."}
        )
        page.goto(f"{base_url}/runs/{run_id}/")
        page.wait_for_selector("#conn[data-state=live]", timeout=WAIT_MS)
        page.wait_for_function(
            "() => document.getElementById('live-text').textContent.length > 30", timeout=WAIT_MS
        )

        workers[0].kill()  # mid-stream; a new worker continues the run after the outage
        pg.stop()
        down_at = time.monotonic()
        page.wait_for_selector("#conn[data-state=reconnecting]", timeout=30_000)
        assert "reconnecting" in page.inner_text("#conn")
        time.sleep(max(0.0, 6 - (time.monotonic() - down_at)))  # an outage of several seconds
        assert page.get_attribute("#conn", "data-state") == "reconnecting"
        # the inbox's poll failed too: it says so and backs off
        inbox.wait_for_selector("#inbox-conn[data-state=reconnecting]", timeout=30_000)
        assert inbox.inner_text("#inbox-conn") == "reconnecting…"
        pg.start()
        up_at = time.monotonic()
        workers.append(start_worker(tmp_path, name="worker-2", **env))
        page.wait_for_selector("#conn[data-state=live], #conn[data-state=finished]", timeout=30_000)
        reconnected = time.monotonic() - up_at
        page.wait_for_selector("#conn[data-state=finished]", timeout=180_000)
        inbox.wait_for_selector("#inbox-conn[data-state=live]", state="hidden", timeout=60_000)

        truth = database_truth(pg, run_id)
        assert truth["status"] == "succeeded"
        turns = page.eval_on_selector_all("#live-text .turn", "els => els.map(e => e.textContent)")
        assert turns == truth["texts"]  # every turn once, in order: no gap, nothing doubled
        assert page.inner_text("#run-output").strip() == truth["output"].strip()
        assert page.get_attribute("#run", "data-last-seq") == str(truth["last_seq"])
        listed = page.eval_on_selector_all(
            "#events li[data-seq]", "els => els.map(e => Number(e.dataset.seq))"
        )
        assert listed == truth["listed"]  # every event once, in order
        states = page.evaluate("window.__connStates")
        assert "reconnecting" in states and states.index("reconnecting") > states.index("live")
        assert states[-1] == "finished"
        print(
            f"\n[db-outage page] reconnected {reconnected:.2f}s after the server's return;"
            f" conn states {states}"
        )
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
