"""The house's layout, checked: a handful of public modules at the top of ``jobs/``, the
internals in ``_``-prefixed packages, no basename used twice, no method that only passes a
call on under its own name, no attribute set on an object from outside it, few imports inside
functions, no Celery signal connected at import time, and a module map in the docs that
lists every module. Each check is also run on a made-up case it must catch."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jobs"
MODULE_MAP = ROOT / "docs" / "explanation" / "architecture.md"

#: What a user imports from the top of the package; everything else lives in a package.
PUBLIC_TOP = {"__init__", "__main__", "application", "celery_app", "results", "tasks"}
#: The public packages; every other package of ``jobs/`` is private (named ``_…``).
PUBLIC_PACKAGES = {"cli", "contrib", "testing", "examples"}
#: Methods that pass a call on under their own name on purpose: each implements a protocol
#: (a unit of work's ``connection``, a test runner's ``run``) or fixes a default for callers.
FORWARDS_ON_PURPOSE = {
    "jobs/_service/sqlalchemy_units.py:connection",  # the UnitOfWork protocol over a Session
    "jobs/_service/operator.py:cancel_selected",  # the service's default reason for a batch
    "jobs/testing/__init__.py:run",  # a runner made per call, with the test's settings
}
#: Where ``jobs/`` sets an attribute of an object not its own (``file:object``): each is
#: another library's object that the library means to be configured so. A jobs object takes
#: what it needs through its constructor or a method, never an attribute set from outside.
SET_FROM_OUTSIDE_ON_PURPOSE = {
    "jobs/_doorbell/amqp.py:transport",  # py-amqp's frame writer, coalesced for one batch
    "jobs/_doorbell/app_queues.py:celery",  # install(app) configures the user's Celery app
    "jobs/contrib/celery.py:app",  # install(app): the gated consumer, kinds before finalize
    "jobs/contrib/celery_control.py:celery",  # send_task, AsyncResult, revoke for job IDs
    "jobs/_store/db.py:dbapi_connection",  # a driver connection, in SQLAlchemy's connect hook
    "jobs/contrib/django/orm_unit.py:engine",  # SQLite's datetimes as Django stores them
    "jobs/_worker/gate.py:message",  # a doorbell's headers made Celery's before it reads them
    "jobs/_worker/installed.py:record",  # a logging filter drops a requeue's traceback
}
#: At most this many imports inside function bodies (a module declares what it loads late
#: with ``lazy_module`` at its top instead, where readers and the layer test see it).
MOST_FUNCTION_LOCAL_IMPORTS = 25


def source_files() -> list[Path]:
    return sorted(
        path for path in PACKAGE.rglob("*.py") if "versions" not in path.relative_to(ROOT).parts
    )


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def repeated_basenames(paths: list[str]) -> dict[str, int]:
    names = Counter(
        Path(path).stem for path in paths if Path(path).stem not in ("__init__", "__main__")
    )
    return {name: count for name, count in names.items() if count > 1}


def forwarders(path: str, tree: ast.Module) -> list[str]:
    """Functions whose whole body is one call of a method of the same name on something
    else, handing it exactly their own parameters."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = [
            statement
            for statement in node.body
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
        ]
        if len(body) != 1 or not isinstance(body[0], ast.Return | ast.Expr):
            continue
        call = body[0].value
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
            continue
        parameters = sorted(
            argument.arg
            for argument in node.args.args + node.args.kwonlyargs
            if argument.arg not in ("self", "cls")
        )
        passed = [value for value in call.args if isinstance(value, ast.Name)]
        passed += [
            keyword.value for keyword in call.keywords if isinstance(keyword.value, ast.Name)
        ]
        handed_on = sorted(value.id for value in passed if isinstance(value, ast.Name))
        if (
            call.func.attr == node.name
            and handed_on == parameters
            and len(call.args) + len(call.keywords) == len(parameters)
        ):
            found.append(f"{path}:{node.name}")
    return found


def set_from_outside(path: str, tree: ast.Module) -> set[str]:
    """``file:object`` for each attribute assignment on an object other than ``self`` or
    ``cls`` (their own attributes, however deep), function metadata (``f.__doc__``) aside."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if not isinstance(part, ast.Attribute) or not isinstance(part.ctx, ast.Store):
                    continue
                root = part.value
                while isinstance(root, ast.Attribute | ast.Call | ast.Subscript):
                    root = root.func if isinstance(root, ast.Call) else root.value
                name = root.id if isinstance(root, ast.Name) else ast.unparse(root)
                if name not in ("self", "cls") and not part.attr.startswith("__"):
                    found.add(f"{path}:{name}")
    return found


def function_local_imports(path: str, tree: ast.Module) -> set[str]:
    """``file:line`` of each import statement inside a function's body."""
    return {
        f"{path}:{node.lineno}"
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Import | ast.ImportFrom)
    }


def connects_at_import(path: str, tree: ast.Module) -> list[str]:
    """Module-level statements that connect a signal handler (``signal.connect(f)`` or a
    ``@signal.connect`` decorator) when the module is imported."""
    found = []
    for statement in tree.body:
        decorators = getattr(statement, "decorator_list", [])
        calls = [
            node
            for node in ([statement.value] if isinstance(statement, ast.Expr) else [])
            if isinstance(node, ast.Call)
        ]
        for node in decorators + calls:
            target = node.func if isinstance(node, ast.Call) else node
            if isinstance(target, ast.Attribute) and target.attr == "connect":
                found.append(f"{path}:{statement.lineno}")
    return found


def test_a_handful_of_public_modules_at_the_top() -> None:
    assert {path.stem for path in PACKAGE.glob("*.py")} == PUBLIC_TOP


def test_internals_live_in_private_packages() -> None:
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert {name for name in packages if not name.startswith("_")} == PUBLIC_PACKAGES


def test_no_basename_is_used_twice() -> None:
    assert repeated_basenames([relative(path) for path in source_files()]) == {}


def test_the_basename_check_finds_a_repeat() -> None:
    assert repeated_basenames(["jobs/_store/doorbells.py", "jobs/_worker/doorbells.py"]) == {
        "doorbells": 2
    }


def test_no_method_only_passes_its_call_on() -> None:
    found = {
        name
        for path in source_files()
        for name in forwarders(relative(path), ast.parse(path.read_text()))
    }
    assert found - FORWARDS_ON_PURPOSE == set()
    assert FORWARDS_ON_PURPOSE - found == set(), "an allowed forwarder is gone: drop it here"


def test_the_forwarder_check_finds_one() -> None:
    tree = ast.parse(
        "class Facade:\n"
        "    def cancel(self, job_id, reason):\n"
        '        """Cancel."""\n'
        "        return self._part.cancel(job_id, reason=reason)\n"
        "    def approve(self, job_id):\n"
        "        return self._part.approve(job_id, by='ops')\n"
    )
    assert forwarders("x.py", tree) == ["x.py:cancel"]


def test_no_attribute_is_set_from_outside_its_object() -> None:
    found = {
        name
        for path in source_files()
        for name in set_from_outside(relative(path), ast.parse(path.read_text()))
    }
    assert found - SET_FROM_OUTSIDE_ON_PURPOSE == set()
    assert SET_FROM_OUTSIDE_ON_PURPOSE - found == set(), "an allowed one is gone: drop it here"


def test_the_outside_attribute_check_finds_one() -> None:
    tree = ast.parse(
        "class Registry:\n"
        "    def __init__(self):\n"
        "        self.scopes = []\n"
        "        self._lock.owner = None\n"
        "def ready(app):\n"
        "    app.registry.step_transactions = open_steps\n"
        "    default_app().settings.queue = 'jobs'\n"
        "    ready.__doc__ = 'Ready.'\n"
    )
    assert set_from_outside("x.py", tree) == {"x.py:app", "x.py:default_app"}


def test_few_imports_stand_inside_functions() -> None:
    found = {
        line
        for path in source_files()
        for line in function_local_imports(relative(path), ast.parse(path.read_text()))
    }
    assert len(found) <= MOST_FUNCTION_LOCAL_IMPORTS, sorted(found)


def test_the_local_import_check_finds_one() -> None:
    tree = ast.parse("import os\ndef later():\n    import json\n    from x import y\n")
    assert function_local_imports("x.py", tree) == {"x.py:3", "x.py:4"}


def test_no_signal_is_connected_at_import() -> None:
    found = [
        line
        for path in source_files()
        for line in connects_at_import(relative(path), ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_signal_check_finds_one() -> None:
    tree = ast.parse(
        "from celery import signals\n"
        "@signals.worker_ready.connect\n"
        "def ready(**_): pass\n"
        "signals.worker_shutdown.connect(ready)\n"
        "def later():\n"
        "    signals.task_prerun.connect(ready)\n"
    )
    assert connects_at_import("x.py", tree) == ["x.py:3", "x.py:4"]


def test_every_module_opens_by_saying_what_it_owns() -> None:
    """Each module with code in it opens with a docstring (an empty ``__init__.py`` that only
    marks a package, as Django's ``management/commands`` needs, has nothing to say)."""
    silent = [
        relative(path)
        for path in source_files()
        if path.read_text().strip() and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert silent == []


def test_the_module_map_lists_every_module() -> None:
    text = MODULE_MAP.read_text()
    missing = [
        relative(path)
        for path in source_files()
        if f"`{relative(path)}`" not in text
        and not (path.name == "__init__.py" and not ast.get_docstring(ast.parse(path.read_text())))
    ]
    assert missing == []


def test_each_lazy_public_name_is_the_one_type_checkers_see() -> None:
    """``jobs.<name>`` loaded on first use is the object ``jobs/__init__.py``'s
    ``if TYPE_CHECKING:`` imports name, so users' type checkers and their programs agree."""
    import importlib  # noqa: PLC0415 - the check imports the public modules itself

    import jobs  # noqa: PLC0415

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    checked = ast.Module(
        body=[
            statement
            for node in tree.body
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
            for statement in node.body
        ],
        type_ignores=[],
    )
    named = {
        alias.name: node.module
        for node in ast.walk(checked)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert named, "no TYPE_CHECKING imports found"
    wrong = [
        name
        for name, module in named.items()
        if getattr(jobs, name) is not getattr(importlib.import_module(module), name)
    ]
    assert wrong == []
    assert set(named) <= set(jobs.__all__)


#: A module this long, or a class with this many methods, holds more than one concern.
MODULE_LINES, CLASS_METHODS = 500, 25


def large_parts(path: str, source: str) -> list[str]:
    """A module of :data:`MODULE_LINES` lines or more, and each class of more than
    :data:`CLASS_METHODS` methods of its own."""
    found = (
        [f"{path}: {len(source.splitlines())} lines"]
        if (len(source.splitlines()) >= MODULE_LINES)
        else []
    )
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            methods = [
                item
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            if len(methods) > CLASS_METHODS:
                found.append(f"{path}:{node.name}: {len(methods)} methods")
    return found


def test_no_module_or_class_is_too_large() -> None:
    """Migrations apart (their bodies are Alembic's shape)."""
    found = [
        part for path in source_files() for part in large_parts(relative(path), path.read_text())
    ]
    assert found == []


def test_the_size_check_finds_a_large_module_and_class() -> None:
    methods = "".join(f"    def m{number}(self): ...\n" for number in range(26))
    source = "class Big:\n" + methods + "\n" * 500
    assert large_parts("x.py", source) == ["x.py: 527 lines", "x.py:Big: 26 methods"]
