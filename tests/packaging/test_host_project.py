"""The apps in a shop's own Django project, as the README's "Add it to your own Django project"
says (DESIGN.md 7): the wheel `pip wheel` builds, installed into a fresh venv; a project made by
`django-admin startproject` with exactly the documented lines; the shop's own Pydantic AI agent
with a refund tool that needs approval and writes the shop's ledger keyed by the step's
idempotency key; its own PostgreSQL database (on the suite's server), daphne serving
`agentruns.asgi:application` and a `qcluster` worker. The run parks, the superuser sees it on
/approvals/, approves it through the API, and the ledger holds one refund.

The venv gets the wheel's dependencies, and only them: their closure (the wheel's
`Requires-Dist`, followed through the installed distributions' metadata) taken from the hashed
lock, so the pins are the suite's own and pip installs them from its cache without resolving;
`--only-binary :all:` proves no compiler is needed, `pip check` that the wheel's declared
dependencies are met, and a module the apps import without declaring it fails the run (the
demo's `support`, `config`, honcho, django-axes and django-csp are not there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

import httpx
import psycopg
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from websockets.sync.client import connect as websocket_connect

from tests.procs import ROOT, Proc, free_port, wait_http

# minutes on a loaded machine: a wheel, a venv, five processes importing the apps afresh
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WHEEL_LIMIT_BYTES = 2 * 1024 * 1024
PASSWORD = "a-shop-superuser-password-0123"

# --- the shop's project: exactly the README's lines, then the shop's own app -----------------
SETTINGS_LINES = """
# --- durable agent runs with an approval inbox (README: "Add it to your own Django project")
INSTALLED_APPS = ["daphne", *INSTALLED_APPS, "channels", "django_q", "django_htmx", "agentruns", "approvals"]
MIDDLEWARE = [*MIDDLEWARE, "django_htmx.middleware.HtmxMiddleware"]
AGENTRUNS_AGENT_MODULES = "ledger.refund_agent"
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.postgresql",
        "NAME": {name!r},
        "USER": {user!r},
        "PASSWORD": {password!r},
        "HOST": {host!r},
        "PORT": {port!r},
    }}
}}

# --- the shop's own
INSTALLED_APPS += ["ledger"]
"""

URLS_LINES = """
from django.urls import include

urlpatterns += [path("", include("agentruns.urls")), path("", include("approvals.urls"))]
"""

LEDGER_MIGRATION = """
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        migrations.CreateModel(
            name="Refund",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
                ("order_id", models.CharField(max_length=40)),
                ("amount_cents", models.PositiveIntegerField()),
                ("idempotency_key", models.CharField(max_length=200, unique=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
"""

LEDGER_MODELS = '''
from django.db import models


class Refund(models.Model):
    """What the shop's payment side has paid out: one row per idempotency key."""

    order_id = models.CharField(max_length=40)
    amount_cents = models.PositiveIntegerField()
    idempotency_key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
'''

# the shop's agent; its model is a FunctionModel standing in for an LLM (no network here)
REFUND_AGENT = '''
import json
import re

from pydantic_ai import Agent
from pydantic_ai.messages import ModelRequest, ModelResponse, UserPromptPart
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, FunctionModel

from agentruns.registry import current_step, durable, register_agent
from ledger.models import Refund


async def desk(messages, info: AgentInfo):
    """Asks for the refund the customer's message names, then tells what the tool answered."""
    if not any(isinstance(m, ModelResponse) for m in messages):
        prompt = next(
            str(part.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for part in m.parts
            if isinstance(part, UserPromptPart)
        )
        order_id, cents = re.search(r"(A-[0-9]+) ([0-9]+)", prompt).groups()
        args = {"order_id": order_id, "amount_cents": int(cents)}
        yield {0: DeltaToolCall(name="refund", json_args=json.dumps(args), tool_call_id="r1")}
        return
    yield "Your refund is on its way."


agent = Agent(
    FunctionModel(stream_function=desk, model_name="shop-desk"),
    name="shop-refunds",
    instructions="You refund the shop's orders when the customer asks.",
)


@agent.tool_plain(requires_approval=True, metadata=durable(side_effect=True, idempotency="key"))
def refund(order_id: str, amount_cents: int) -> dict:
    """Refund an order; a person approves it in the inbox first."""
    key = current_step().idempotency_key  # the same on every attempt of this call
    row, created = Refund.objects.get_or_create(
        idempotency_key=key, defaults={"order_id": order_id, "amount_cents": amount_cents}
    )
    return {"refund_id": row.id, "new": created}


register_agent(agent)
'''


# --- the wheel --------------------------------------------------------------------------------
def build_wheel(work: Path) -> Path:
    """`pip wheel` of a copy of the files the wheel is built from (a build inside the checkout
    could pick up a stale build/ directory)."""
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("agentruns", "approvals"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    dist = work / "dist"
    pip("wheel", "--no-deps", "-w", str(dist), str(source))
    (wheel,) = dist.glob("*.whl")
    return wheel


def pip(*args: str, into: Path | None = None) -> subprocess.CompletedProcess:
    """The suite's own pip; `into`: the Python of the environment it manages instead (a venv
    made without pip of its own: no pip, no setuptools there that a dependency could lean on)."""
    target = ("--python", str(into)) if into is not None else ()
    done = subprocess.run(
        [sys.executable, "-m", "pip", *target, "--disable-pip-version-check", "-q", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"pip {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(name).decode())
    requirements = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]


def dependency_closure(requirements: list[Requirement]) -> set[str]:
    """The distributions `requirements` need, with their extras, read from the metadata of the
    ones installed here (the suite's venv holds the whole lock)."""
    needed: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    queue = list(requirements)
    while queue:
        requirement = queue.pop()
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        needed.add(name)
        for raw in metadata.distribution(name).requires or []:
            nested = Requirement(raw)
            extras = requirement.extras | {""}
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in extras):
                queue.append(nested)
    return needed


def locked_subset(names: set[str], target: Path) -> int:
    """The lock's entries (pins and hashes) for `names`, written to `target`; how many."""
    blocks, current = [], None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==", line)
        if match:
            current = [line] if canonicalize_name(match.group(1)) in names else None
            if current is not None:
                blocks.append(current)
        elif current is not None and line.startswith(" ") and not line.strip().startswith("#"):
            current.append(line)
    target.write_text("\n".join("\n".join(block) for block in blocks) + "\n")
    return len(blocks)


# --- the shop's database, on the suite's server ----------------------------------------------
def server_settings() -> dict[str, str]:
    url = urlparse(os.environ["DATABASE_URL"])
    return {
        "user": unquote(url.username or ""),
        "password": unquote(url.password or ""),
        "host": url.hostname or "127.0.0.1",
        "port": str(url.port or 5432),
    }


def admin_connection(server: dict[str, str]) -> psycopg.Connection:
    return psycopg.connect(dbname="postgres", autocommit=True, **server)


# --- the project's processes -----------------------------------------------------------------
class Shop:
    def __init__(self, work: Path, python: Path, project: Path, env: dict[str, str]) -> None:
        self.work, self.python, self.project, self.env = work, python, project, env

    def manage(self, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [str(self.python), "manage.py", *args],
            cwd=self.project,
            env={**self.env, **extra_env},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done


def start_in(project: Path, args: list[str], env: dict[str, str], log: Path) -> Proc:
    """A process of the shop's, in its project's directory (Proc.start runs in the checkout)."""
    proc = Proc(args, env, log)
    proc.log_file = open(log, "ab")
    proc.popen = subprocess.Popen(
        args,
        cwd=project,
        env=env,
        stdout=proc.log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc


def wait_for(what: str, probe, timeout: float = 60, procs: tuple[Proc, ...] = ()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        for proc in procs:
            assert proc.alive, f"a process exited while waiting for {what}:\n{proc.log()}"
        time.sleep(0.2)
    logs = "\n".join(proc.log() for proc in procs)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def sign_in(http: httpx.Client, username: str, password: str) -> None:
    """Through the host's own login page (its admin's: the project has no other)."""
    page = http.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    answer = http.post(
        "/admin/login/?next=/admin/",
        data={"csrfmiddlewaretoken": token, "username": username, "password": password},
        headers={"Referer": str(http.base_url) + "/admin/login/"},
    )
    assert answer.status_code == 302, answer.text[:500]


# --- the test --------------------------------------------------------------------------------
def test_a_shop_project_installs_the_wheel_and_runs_its_agent_through_an_approval(tmp_path):
    started = time.monotonic()
    wheel = build_wheel(tmp_path)
    print(f"wheel built: {time.monotonic() - started:.1f}s")

    # the wheel: small, the two apps with their files, nothing of the demo or the tests
    assert wheel.stat().st_size < WHEEL_LIMIT_BYTES, wheel.stat().st_size
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"agentruns", "approvals", wheel.name.split("-")[0] + "-0.1.0.dist-info"}, tops
    for expected in (
        "agentruns/migrations/0001_initial.py",
        "approvals/migrations/0001_initial.py",
        "agentruns/templates/agentruns/base.html",
        "approvals/templates/approvals/inbox.html",
        "approvals/templates/approvals/email/digest.txt",
        "agentruns/static/agentruns/app.css",
        "approvals/static/approvals/inbox.js",
        "agentruns/management/commands/qcluster.py",
        "agentruns/management/commands/create_api_token.py",
        "agentruns/asgi.py",
    ):
        assert expected in names, expected
    assert not [n for n in names if re.search(r"(^|/)(support|config|tests)/", n)]

    # a fresh venv with the wheel's dependencies alone, all binary wheels, then the wheel
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    requirements = wheel_requirements(wheel)
    closure = dependency_closure(requirements)
    assert not closure & {"honcho", "django-axes", "django-csp", "pytest"}, closure
    lock = tmp_path / "wheel-dependencies.lock"
    assert locked_subset(closure, lock) == len(closure), "a dependency is missing from the lock"
    # (nothing byte-compiled here: the shop's first process compiles what it imports)
    install = ("install", "--no-deps", "--no-compile")
    pip(*install, "--only-binary", ":all:", "--require-hashes", "-r", str(lock), into=python)
    pip(*install, "--no-index", str(wheel), into=python)
    pip("check", into=python)
    print(f"venv installed: {time.monotonic() - started:.1f}s")
    installed = subprocess.run(
        [str(python), "-c", "import agentruns, approvals; print(agentruns.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert str(venv) in installed  # the wheel's, not the checkout's

    # the shop's project, made by django-admin, with exactly the documented lines
    (tmp_path / "site").mkdir()
    subprocess.run(
        [str(venv / "bin" / "django-admin"), "startproject", "shop", str(tmp_path / "site")],
        check=True,
        timeout=60,
        cwd=tmp_path,
    )
    project = tmp_path / "site"
    server = server_settings()
    database = f"shop_{uuid.uuid4().hex[:12]}"
    settings_py = project / "shop" / "settings.py"
    settings_py.write_text(settings_py.read_text() + SETTINGS_LINES.format(name=database, **server))
    urls_py = project / "shop" / "urls.py"
    urls_py.write_text(urls_py.read_text() + URLS_LINES)
    ledger = project / "ledger"
    (ledger / "migrations").mkdir(parents=True)
    (ledger / "__init__.py").write_text("")
    (ledger / "migrations" / "__init__.py").write_text("")
    (ledger / "models.py").write_text(LEDGER_MODELS)
    (ledger / "migrations" / "0001_initial.py").write_text(LEDGER_MIGRATION)
    (ledger / "refund_agent.py").write_text(REFUND_AGENT)

    env = {
        key: value
        for key, value in os.environ.items()
        # nothing of the suite's own project reaches the shop's processes
        if not key.startswith(("DJANGO_", "AGENTRUNS_", "Q_", "REFUND_", "DATABASE_URL"))
        and key not in ("PYTHONPATH", "VIRTUAL_ENV")
        # the venv's bytecode is written by the first process that imports a module and read by
        # every later one (a suite run with PYTHONDONTWRITEBYTECODE set would have each of the
        # shop's five processes compile its imports afresh: seconds of CPU each)
        and key != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    shop = Shop(tmp_path, python, project, env)

    with admin_connection(server) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    procs: list[Proc] = []
    try:
        # migrate runs `manage.py check` first: the apps' errors would stop it, their warnings
        # (no connection pool, no login page: the documented lines add neither) are printed
        migrated = shop.manage("migrate", "--noinput")
        assert "agentruns.E" not in migrated.stdout + migrated.stderr
        shop.manage(
            "createsuperuser",
            "--noinput",
            "--username",
            "boss",
            "--email",
            "boss@shop.example",
            DJANGO_SUPERUSER_PASSWORD=PASSWORD,
        )
        token = shop.manage("create_api_token", "boss").stdout.strip().splitlines()[-1]

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        daphne = [str(venv / "bin" / "daphne"), "-b", "127.0.0.1", "-p", str(port)]
        web = start_in(project, [*daphne, "agentruns.asgi:application"], env, tmp_path / "web.log")
        procs.append(web)
        worker = start_in(
            project, [str(python), "manage.py", "qcluster"], env, tmp_path / "worker.log"
        )
        procs.append(worker)
        wait_http(base + "/healthz", web, timeout=60)
        print(f"serving: {time.monotonic() - started:.1f}s")

        bearer = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=base, headers=bearer, timeout=15) as api:
            created = api.post(
                "/api/runs",
                json={"agent": "shop-refunds", "input": {"message": "Please refund A-17 1250"}},
            )
            assert created.status_code == 201, created.text
            run_id = created.json()["id"]

            def run() -> dict:
                return api.get(f"/api/runs/{run_id}").json()

            # the run parks on the refund, in the inbox
            parked = wait_for(
                "the run to park",
                lambda: (r := run())["status"] == "waiting" and r,
                90,
                (web, worker),
            )
            (step,) = [s for s in parked["steps"] if s["tool"] == "refund"]
            assert step["status"] == "waiting_approval"
            pending = api.get("/api/approvals", params={"status": "pending"}).json()["approvals"]
            (approval,) = [a for a in pending if a["run_id"] == run_id]
            assert approval["args"] == {"order_id": "A-17", "amount_cents": 1250}

            # the stream, over the same port: the socket replays the run's events
            ws_url = base.replace("http", "ws", 1) + f"/ws/runs/{run_id}/?after=0"
            with websocket_connect(
                ws_url, additional_headers={**bearer, "Origin": base}, open_timeout=15
            ) as socket:
                frame = json.loads(socket.recv(timeout=15))
                assert frame["seq"] == 1 and frame["type"]

        # the superuser sees it on /approvals/, in the apps' own layout
        with httpx.Client(base_url=base, timeout=15) as browser:
            sign_in(browser, "boss", PASSWORD)
            inbox = browser.get("/approvals/")
            assert inbox.status_code == 200, inbox.text[:500]
            assert f'data-approval="{approval["id"]}"' in inbox.text
            assert "A-17" in inbox.text and "/static/agentruns/app.css" in inbox.text
            assert browser.get("/static/agentruns/app.css").status_code == 200
            assert browser.get(f"/runs/{run_id}/").status_code == 200

        # approved through the API: the run finishes, the ledger holds one refund, by the key
        with httpx.Client(base_url=base, headers=bearer, timeout=15) as api:
            decided = api.post(f"/api/approvals/{approval['id']}", json={"decision": "approve"})
            assert decided.status_code == 200, decided.text
            assert decided.json()["status"] == "approved"
            finished = wait_for(
                "the run to finish",
                lambda: (
                    (r := api.get(f"/api/runs/{run_id}").json())["status"]
                    in ("succeeded", "failed")
                    and r
                ),
                90,
                (web, worker),
            )
        assert finished["status"] == "succeeded", finished
        (step,) = [s for s in finished["steps"] if s["tool"] == "refund"]
        with psycopg.connect(dbname=database, **server) as shop_db:
            rows = shop_db.execute(
                "SELECT order_id, amount_cents, idempotency_key FROM ledger_refund"
            ).fetchall()
        assert rows == [("A-17", 1250, step["idempotency_key"])]
        for proc in procs:
            assert "Traceback" not in proc.log(), proc.log()
    finally:
        for proc in procs:
            proc.kill()
        with admin_connection(server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    print(f"host project test: {time.monotonic() - started:.1f}s")
