"""A module imported at its first use, declared at the top of the module that uses it.

A worker's main process, ``jobctl --help`` and a web app that only defines jobs must not pay
for SQLAlchemy, Celery, Alembic or Flower before they need them. Rather than an import
hidden in a function body, a module declares such a dependency once, at its top, where a
reader (and the layer test, ``tests/test_imports.py``) sees it::

    if TYPE_CHECKING:
        from jobs._worker import process
    else:
        process = lazy_module("jobs._worker.process")

Type checkers see the real module; at run time the first attribute read imports it
(through :func:`importlib.import_module`, whose module locks make that safe from several
threads at once) and every later read is a plain attribute lookup on it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class lazy_module:
    """The module ``name``, imported when one of its attributes is first read."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


__all__ = ["lazy_module"]
