"""The modules jobctl's commands use that load SQLAlchemy, Alembic, kombu, Celery or the
metrics library, each declared once here and imported at its first use, so that
``jobctl --help`` and a mistyped command load none of them (``tests/test_imports.py``).

A command module takes what it needs by name::

    from jobs.cli.command_modules import metrics as prometheus

Type checkers see the real modules; at run time each name is a
:class:`jobs._core.lazy.lazy_module` until a command reads one of its attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobs._core.lazy import lazy_module

if TYPE_CHECKING:
    from jobs._doorbell import queues
    from jobs._service import explain, replay_check
    from jobs._store import pause_clauses, schema
    from jobs._sweeper import metrics, queue_watch, sweeper
    from jobs._worker import live_workers, outcome_events
    from jobs.cli import demo, show_text, simulate
else:
    #: Each deferred module, named by the last part of its path.
    DEFERRED = {
        path.rpartition(".")[2]: lazy_module(path)
        for path in (
            "jobs._doorbell.queues",
            "jobs._service.explain",
            "jobs._service.replay_check",
            "jobs._store.pause_clauses",
            "jobs._store.schema",
            "jobs._sweeper.metrics",
            "jobs._sweeper.queue_watch",
            "jobs._sweeper.sweeper",
            "jobs._worker.live_workers",
            "jobs._worker.outcome_events",
            "jobs.cli.demo",
            "jobs.cli.show_text",
            "jobs.cli.simulate",
        )
    }

    def __getattr__(name: str) -> lazy_module:
        """The deferred module ``name`` (PEP 562: read once per importing module)."""
        try:
            return DEFERRED[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


__all__ = [
    "demo",
    "explain",
    "live_workers",
    "metrics",
    "outcome_events",
    "pause_clauses",
    "queue_watch",
    "queues",
    "replay_check",
    "schema",
    "show_text",
    "simulate",
    "sweeper",
]
