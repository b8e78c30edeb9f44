"""One writer in the engine room: every Step, StepAttempt and RunEvent row is written by
`agentruns/runtime/writer.py` (through the store below it), by no other module above the store.

The code of agentruns/ and approvals/ is read as Python (ast), so a write is found however it
is spelled: an ORM write on those models' managers and querysets, a `save`/`delete` of
an instance that is a Step or a StepAttempt (bound from their manager, built, a parameter
annotated so, or an approval's `.step`), a call of one of the store's writing methods, or SQL
naming one of their tables."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITER = "agentruns/runtime/writer.py"
BELOW = "agentruns/runtime/store/"  # the store: the writer's only way to the database
MODELS = {"Step", "StepAttempt", "RunEvent"}
ORM_WRITES = {
    "update",
    "create",
    "bulk_create",
    "bulk_update",
    "delete",
    "get_or_create",
    "update_or_create",
}
INSTANCE_WRITES = {"save", "delete"}
STORE_WRITES = {"commit", "append", "create_run", "claim", "commit_deltas", "relet_abandoned"}


def _root_name(node: ast.AST) -> str | None:
    """The name an attribute/call chain starts from (`Step` in `Step.objects.filter().update`)."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node.id if isinstance(node, ast.Name) else None


def _chain_has(node: ast.AST, attr: str) -> bool:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        if isinstance(node, ast.Attribute) and node.attr == attr:
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def _is_step_source(value: ast.AST) -> bool:
    """An expression whose value is a Step or StepAttempt instance (or a list of them)."""
    if isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Name) and func.id in MODELS:
            return True  # Step(...)
        if isinstance(func, ast.Name) and func.id == "build" and value.args:
            first = value.args[0]
            return isinstance(first, ast.Name) and first.id in MODELS
    root = _root_name(value)
    return root in MODELS and _chain_has(value, "objects")


def _annotated_step(annotation: ast.AST | None) -> bool:
    text = ast.unparse(annotation) if annotation is not None else ""
    return any(word in text.replace("|", " ").split() for word in ("Step", "StepAttempt"))


class _Finder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.step_names: set[str] = set()
        self.store_names: set[str] = {"store"}

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for arg in [*node.args.args, *node.args.kwonlyargs]:
            if _annotated_step(arg.annotation):
                self.step_names.add(arg.arg)
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if not isinstance(target, ast.Name):
            return
        if _is_step_source(value):
            self.step_names.add(target.id)
        if isinstance(value, ast.Call) and ast.unparse(value.func) in ("get_store", "self.store"):
            self.store_names.add(target.id)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._bind(target, node.value)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._bind(node.target, node.iter)
        # a loop over a run's steps however they are held (`self.state.steps[cursor:]`)
        if isinstance(node.target, ast.Name) and "steps" in ast.unparse(node.iter):
            self.step_names.add(node.target.id)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            receiver = func.value
            text = ast.unparse(receiver)
            if (
                func.attr in ORM_WRITES
                and _root_name(func) in MODELS
                and _chain_has(func, "objects")
            ):
                self.found.append((node.lineno, ast.unparse(node)[:80]))
            elif func.attr in INSTANCE_WRITES and (
                (isinstance(receiver, ast.Name) and receiver.id in self.step_names)
                or text.endswith(".step")
            ):
                self.found.append((node.lineno, ast.unparse(node)[:80]))
            elif func.attr in STORE_WRITES and (
                text in ("get_store()", "self.store") or text in self.store_names
            ):
                self.found.append((node.lineno, ast.unparse(node)[:80]))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # SQL of their own against these tables (`RunEvent._meta.db_table` in a statement)
        if (
            node.attr == "db_table"
            and isinstance(node.value, ast.Attribute)
            and _root_name(node) in MODELS
        ):
            self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def writes_outside_the_writer() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for package in ("agentruns", "approvals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if "/migrations/" in name or name == WRITER or name.startswith(BELOW):
                continue
            finder = _Finder()
            finder.visit(ast.parse(path.read_text(), name))
            if finder.found:
                found[name] = finder.found
    return found


def test_no_module_but_the_writer_writes_steps_attempts_or_events():
    assert writes_outside_the_writer() == {}


def test_the_check_finds_each_kind_of_write():
    """The walk is not blind: each way of writing such a row is found in a sample."""
    sample = """
from agentruns.models import Step, StepAttempt, RunEvent
def f(step: Step, run):
    Step.objects.filter(run=run).update(status="x")
    StepAttempt.objects.create(step=step, number=1)
    step.save()
    for other in Step.objects.filter(run=run):
        other.delete()
    made = build(Step, id=1)
    made.save()
    run.approval.step.save(update_fields=["status"])
    get_store().append(run.id, [])
    store = get_store()
    store.commit(run.id, "me", [])
    sql = f"INSERT INTO {RunEvent._meta.db_table} VALUES (1)"
    for later in self.state.steps[3:]:
        later.save(update_fields=["status"])
"""
    finder = _Finder()
    finder.visit(ast.parse(sample))
    assert [line for line, _ in finder.found] == [4, 5, 6, 8, 10, 11, 12, 14, 15, 17]
