"""The oldest code a schema serves: what makes a rolling upgrade possible.

A release's migrations expand (add nullable columns, tables, indexes) so that the previous
release's code keeps working against them; a later release may contract (drop or change
what no code still running uses). Each migration from 0011 on declares ``OLDEST_CODE``,
the oldest code revision that runs against the schema once it is in, and writes it to the
one row of ``job_schema_floor``; ``tests/test_migrations.py`` checks that a migration that
drops or changes anything raises it at least to its own parent. Code that finds the
schema newer than itself reads the row (:func:`oldest_code`): at or below its own revision,
it runs (its workers keep running and restarting while the new ones roll out); above it,
it stops with one line, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from jobs._core.lazy import lazy_module
from jobs._store.db import READ_ONLY

if TYPE_CHECKING:
    from alembic import op
else:  # only inside a migration: a worker that reads the floor never loads Alembic
    op = lazy_module("alembic.op")


def record_oldest_code(revision: str) -> None:
    """From a migration's ``upgrade()``: the schema now serves code from ``revision`` on."""
    op.execute(text("DELETE FROM job_schema_floor"))
    op.execute(
        text("INSERT INTO job_schema_floor (id, oldest_code) VALUES (1, :oldest)").bindparams(
            oldest=revision
        )
    )


def oldest_code(engine: Engine) -> str | None:
    """The oldest code revision the database's schema serves; ``None`` when it says none
    (a schema from before 0011, or no job tables)."""
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        try:
            found = conn.execute(text("SELECT oldest_code FROM job_schema_floor")).scalar()
        except DBAPIError:
            return None
    return None if found is None else str(found)


__all__ = ["oldest_code", "record_oldest_code"]
