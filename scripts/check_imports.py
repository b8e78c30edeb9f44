"""What import-linter's contracts cannot say, checked by `make lint`:

1. no import cycle among the project's modules (migrations and tests aside), counting imports
   inside functions too (grimp sees those);
2. the runtime imports none of Django's HTTP, template, URL or view modules, nor Channels'
   consumers (import-linter only sees external packages as a whole);
3. one concept in one module: no module of agentruns/, approvals/ or support/ imports another's
   private (`_name`) names: two modules that need each other's insides are one module, however
   long (split by concept, never by size);
4. pydantic-ai's private modules and names are imported in one module only (PRIVATE_API),
   which says why for each;
5. sizes: no module there over MAX_LINES lines (a generous bound: a concept past it is worth a
   second look), and no package (the apps' roots and every subpackage) holding more than
   MAX_MODULES .py modules of its own (`__init__.py` counted, subpackages and migrations not).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agentruns", "approvals", "support", "config")
RUNTIME = (
    "agentruns/runtime",
    "approvals/domain/parking.py",
    "approvals/domain/outcomes.py",
    "approvals/domain/escalation.py",
    "approvals/notifications/outbox.py",
)
SIZED = ("agentruns", "approvals", "support")
MAX_LINES = 650
PRIVATE_API = "agentruns/runtime/engine/pydantic_ai_private.py"
MAX_MODULES = 12
FORBIDDEN_IN_RUNTIME = (
    "django.http",
    "django.shortcuts",
    "django.template",
    "django.views",
    "django.urls",
    "django.contrib.admin",
    "channels.generic",
    "channels.routing",
    "channels.auth",
)


def cycles() -> list[list[str]]:
    graph = grimp.build_graph(*PACKAGES)
    modules = sorted(m for m in graph.modules if ".migrations" not in m)
    edges = {
        m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules)
        for m in modules
    }
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            targets = edges[node]
            if child < len(targets):
                work.append((node, child + 1))
                target = targets[child]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            for target in targets:
                if target in on_stack:
                    low[node] = min(low[node], low[target])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges[node]:
                    found.append(sorted(component))
    return found


def runtime_imports() -> list[str]:
    problems = []
    files = [
        p
        for spec in RUNTIME
        for p in ([ROOT / spec] if spec.endswith(".py") else (ROOT / spec).rglob("*.py"))
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IN_RUNTIME):
                    problems.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    return problems


def private_imports() -> list[str]:
    """`from <project module> import _name` in the apps (tests and migrations aside)."""
    problems = []
    for app in SIZED:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        problems.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}."
                            f"{alias.name}: one concept is one module (merge them, or make the "
                            "name public)"
                        )
    return problems


def pydantic_ai_private() -> list[str]:
    """Imports of pydantic-ai's private modules or names outside PRIVATE_API."""
    problems = []
    for app in SIZED:
        for path in sorted((ROOT / app).rglob("*.py")):
            if path == ROOT / PRIVATE_API:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                for name in names:
                    parts = name.split(".")
                    if parts[0] == "pydantic_ai" and any(
                        p.startswith("_") and not p.startswith("__") for p in parts[1:]
                    ):
                        problems.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} imports {name}: pydantic-ai's "
                            f"private names go through {PRIVATE_API} (with why)"
                        )
                        break
    return problems


def sizes() -> list[str]:
    """Modules over MAX_LINES lines and packages over MAX_MODULES .py modules (migrations aside)."""
    problems = []
    for app in SIZED:
        for package in sorted({p.parent for p in (ROOT / app).rglob("__init__.py")}):
            if "migrations" in package.relative_to(ROOT).parts:
                continue
            modules = sorted(p.name for p in package.glob("*.py"))
            if len(modules) > MAX_MODULES:
                problems.append(
                    f"{package.relative_to(ROOT)}/ holds {len(modules)} .py modules at its root "
                    f"(at most {MAX_MODULES}, __init__.py counted): group some into a subpackage"
                )
            for name in modules:
                path = package / name
                lines = len(path.read_text().splitlines())
                if lines > MAX_LINES:
                    problems.append(
                        f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"
                    )
    return problems


def main() -> int:
    sys.path.insert(0, str(ROOT))
    failed = False
    for component in cycles():
        print("import cycle:", " <-> ".join(component))
        failed = True
    for problem in runtime_imports():
        print("runtime import:", problem)
        failed = True
    for problem in private_imports():
        print("private import:", problem)
        failed = True
    for problem in pydantic_ai_private():
        print("pydantic-ai private:", problem)
        failed = True
    for problem in sizes():
        print("size:", problem)
        failed = True
    if not failed:
        print(
            "imports: no cycles among the project's modules; the runtime imports no web modules; "
            "no module imports another's private names; "
            f"sizes: no module over {MAX_LINES} lines, no package over {MAX_MODULES} .py modules"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
