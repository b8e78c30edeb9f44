"""What the browser tests share: a password the server can check and signing in
(`logged_in_page`); for the journeys, a signed-in page that watches the Content Security Policy,
screenshots saved as test artifacts, the servers of one journey, and a run page followed to the
run's end.

Every journey's page records CSP violations (the `securitypolicyviolation` event and the
console's messages) and the policy header of every document it loads; `Journey.check_csp()`
asserts both. Screenshots go to var/test-artifacts/e2e/<journey>-<n>-<label>.png (gitignored);
docs/screenshots/ keeps three of them for the README.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.conf import global_settings
from django.contrib.auth.hashers import make_password

from agentruns.models import Run, Step
from tests.procs import ROOT, wait_until

ARTIFACTS = ROOT / "var" / "test-artifacts" / "e2e"
PASSWORD = "browser-pw-Quokka-73"
WAIT_MS = 120_000


def browser_marks(timeout_seconds: int = 600) -> list[Any]:
    """The marks of a browser test module: live servers need committed rows, and it is slow."""
    return [
        pytest.mark.django_db(transaction=True),
        pytest.mark.e2e,
        pytest.mark.slow,
        pytest.mark.timeout(timeout_seconds),
    ]


CSP_WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + (e.sourceFile || ""));
});
"""


def set_browser_password(user: Any, settings: Any) -> None:
    """The suite hashes with MD5 for speed; the server processes know only the real hashers.
    The real (PBKDF2, a million rounds) hash of PASSWORD is made once per test process and
    given to every user (one salt for all: these are test users; the server still checks it)."""
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    if PASSWORD not in _REAL_HASHES:
        _REAL_HASHES[PASSWORD] = make_password(PASSWORD)
    user.password = _REAL_HASHES[PASSWORD]
    user.save(update_fields=["password"])


_REAL_HASHES: dict[str, str] = {}


def logged_in_page(browser, base_url: str, username: str, init_script: str, next_path: str = ""):
    """A new page with `init_script` installed, signed in as `username` through the login form;
    it waits until the sign-in has landed (on `next_path` if given)."""
    page = browser.new_page()
    page.add_init_script(init_script)
    page.goto(f"{base_url}/accounts/login/" + (f"?next={next_path}" if next_path else ""))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    if next_path:
        page.wait_for_url(re.compile(re.escape(next_path) + "$"), timeout=WAIT_MS)
    else:
        page.wait_for_url(lambda url: "/accounts/login" not in url, timeout=WAIT_MS)
    return page


@dataclass
class Journey:
    name: str
    page: Any
    base_url: str
    console_violations: list[str] = field(default_factory=list)
    documents: list[tuple[str, str | None]] = field(default_factory=list)  # (url, CSP header)
    shots: list[Path] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)  # alert()s: a script ran that must not

    @classmethod
    def open(cls, browser: Any, base_url: str, name: str) -> Journey:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        journey = cls(name, page, base_url)
        page.add_init_script(CSP_WATCH)
        page.on("console", journey._console)
        page.on("response", journey._response)
        page.on("dialog", journey._dialog)
        return journey

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _console(self, message: Any) -> None:
        if "Content Security Policy" in message.text or "Content-Security-Policy" in message.text:
            self.console_violations.append(message.text)

    def _response(self, response: Any) -> None:
        if response.request.resource_type == "document" and response.url.startswith(self.base_url):
            self.documents.append((response.url, response.headers.get("content-security-policy")))

    def sign_in(self, username: str, then: str = "/runs/") -> None:
        self.page.goto(f"{self.base_url}/accounts/login/?next={then}")
        self.page.fill("input[name=username]", username)
        self.page.fill("input[name=password]", PASSWORD)
        self.page.click("button[type=submit]")
        self.page.wait_for_url(lambda url: "/accounts/login" not in url, timeout=WAIT_MS)

    def go(self, path: str) -> None:
        self.page.goto(self.base_url + path)

    def shot(self, label: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{self.name}-{len(self.shots) + 1}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        self.shots.append(path)
        return path

    def violations(self) -> list[str]:
        try:
            seen = self.page.evaluate("window.__csp || []")
        except Exception:  # the page is navigating: the console log still has them
            seen = []
        return [*seen, *self.console_violations]

    def check_csp(self) -> None:
        """Every document had the policy header, and nothing was blocked by it."""
        assert self.documents, "no page was loaded"
        missing = [url for url, header in self.documents if not header]
        assert not missing, f"pages without a Content-Security-Policy header: {missing}"
        assert not self.violations(), f"CSP violations on {self.name}: {self.violations()}"


AXE = ROOT / "tests" / "node" / "node_modules" / "axe-core" / "axe.min.js"  # `make node-deps`


def axe_problems(page: Any, impacts: tuple[str, ...] = ("serious", "critical")) -> list[str]:
    """What axe-core (the npm package, tests/node) finds on the page as it is now, at these
    impacts: one line per rule and element. The script is evaluated through the DevTools
    protocol, which the page's Content Security Policy does not apply to (a <script> tag would
    be refused, rightly)."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(AXE.read_text(encoding="utf-8"))
    result = page.evaluate(
        """async () => {
            const r = await axe.run(document, {resultTypes: ["violations"]});
            return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.map(n => n.target.join(" ") + ": " + n.failureSummary)}));
        }"""
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {node}"
        for v in result
        if v["impact"] in impacts
        for node in v["nodes"]
    ]


def no_access_problems(journey: Journey, where: str) -> None:
    """axe-core finds nothing serious or critical on the journey's page."""
    problems = axe_problems(journey.page)
    assert not problems, f"axe on {where}:\n" + "\n".join(problems)


def parked(run: Any, kind: str = "approval") -> Any:
    """The run's pending inbox item of `kind`, once the run parked (a worker executes it)."""
    from approvals.models import Approval

    return wait_until(
        lambda: Approval.objects.filter(run=run, kind=kind, status="pending").first(),
        timeout=120,
        message="the run to park in the inbox",
    )


def settled(run_id: Any) -> Run | None:
    """The run's row once it is terminal, else None."""
    run = Run.objects.get(id=run_id)
    return run if run.is_terminal else None


def watch_run_page_to_the_end(journey: Journey, run: Run) -> Run:
    """The run page (open in `journey`) follows the run to its end: every model turn whole and
    in order, the output, the status and every step's final status as the database has them."""
    page = journey.page
    page.wait_for_selector("#conn[data-state=finished]", timeout=WAIT_MS)
    done = wait_until(lambda: settled(run.id), timeout=60, message="the run to end")
    turns = page.eval_on_selector_all("#live-text .turn", "els => els.map(e => e.textContent)")
    texts = list(
        Step.objects.filter(run=done, kind="model").order_by("index").values_list("text", flat=True)
    )
    assert turns == texts  # every turn whole, once, in order
    assert page.inner_text("#run-output").strip() == done.output.strip()
    assert page.inner_text("#run-status") == done.status
    # the step table follows in place: every step, each with its final status
    statuses = list(done.steps.order_by("index").values_list("status", flat=True))
    page.wait_for_function(
        """expected => JSON.stringify([...document.querySelectorAll('#steps tr[id^=step-] .chip')]
            .map(chip => chip.textContent.trim())) === JSON.stringify(expected)""",
        arg=statuses,
        timeout=WAIT_MS,
    )
    return done
