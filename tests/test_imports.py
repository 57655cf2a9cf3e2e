"""The house's shape, checked: no import circle among the modules of ``jobs/`` (imports
inside functions and modules declared with ``lazy_module("…")`` included; those under
``if TYPE_CHECKING:`` never run and are left out),
and layers that point one way (:data:`LAYERS`, bottom first)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jobs"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path for path in PACKAGE.rglob("*.py") if "migrations" not in path.parts
    }


def type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """The statements under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    return {
        statement
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for statement in node.body
    }


def imported_names(path: Path, name: str) -> Iterator[str]:
    """Every ``jobs`` module ``path`` imports when it runs, wherever the import statement
    stands (a function's body too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skipped = type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_module":
            if isinstance(node.args[0], ast.Constant):
                yield node.args[0].value  # a module imported on use
            else:  # built from a table of paths: every module path the file spells counts
                yield from (
                    string.value
                    for string in ast.walk(tree)
                    if isinstance(string, ast.Constant) and isinstance(string.value, str)
                )
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            yield source
            yield from (f"{source}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module → the ``jobs`` modules it imports (a name that is not a module, such as a
    function imported from one, counts as its module)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = {target for target in imported_names(path, name) if target in known}
        graph[name] = targets - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_the_check_finds_a_circle() -> None:
    """The check itself can fail: a circle made by hand is found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


LAYERS = (
    # Bottom first. A module may import its own layer's modules and those of layers below.
    ("jobs._core", "jobs._config"),  # rules, records, settings: no SQL, no Celery
    ("jobs._store",),  # the only package that writes the job tables
    ("jobs._doorbell",),  # publishing job IDs, the queues
    ("jobs._worker",),  # the process state, Celery's worker, delivery, the runner
    ("jobs._sweeper", "jobs._service"),  # recovery, metrics; the application's services
    ("jobs.application", "jobs.tasks", "jobs.results", "jobs.celery_app", "jobs"),
    ("jobs.cli", "jobs.contrib", "jobs.testing", "jobs.examples", "jobs.__main__"),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the package ``module`` belongs to (the longest match)."""
    best = max(
        (len(package), index)
        for index, packages in enumerate(LAYERS)
        for package in packages
        if module == package or module.startswith(package + ".")
    )
    return best[1]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        for target in targets
        if layer_of(target) > layer_of(source)
    )


def test_every_module_has_a_layer() -> None:
    for module in modules():
        layer_of(module)  # max() of nothing raises


def test_layers_point_one_way() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layer_check_finds_an_upward_import() -> None:
    assert upward_imports({"jobs._store.tables": {"jobs._worker.process"}}) == [
        "jobs._store.tables imports jobs._worker.process"
    ]
