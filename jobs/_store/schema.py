"""Schema management: Alembic migrations shipped inside the package.

The embedded default (SQLite) upgrades itself on first use so ``import jobs`` just
works on a laptop; a shared PostgreSQL is upgraded only by ``jobctl db upgrade``, and
a process that finds it behind stops with a message saying so. A schema newer than the
code (written by a newer release) is never "upgraded": the message names both revisions
and says to upgrade the code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from jobs._core.errors import SettingsError
from jobs._core.lazy import lazy_module
from jobs._store.db import READ_ONLY
from jobs._store.schema_floor import oldest_code
from jobs._store.tables import SCHEMA_REVISION

if TYPE_CHECKING:
    from alembic import command
    from alembic import config as alembic_config_module
    from alembic import script as alembic_script
    from alembic.config import Config
else:  # Alembic only to migrate: a worker that checks the revision never loads it
    command = lazy_module("alembic.command")
    alembic_config_module = lazy_module("alembic.config")
    alembic_script = lazy_module("alembic.script")

MIGRATIONS = Path(__file__).parent / "migrations"


_REVISION_LINE = re.compile(r"^(revision|down_revision)\s*:[^=]*=\s*['\"]([^'\"]+)['\"]", re.M)


def known_revisions() -> list[str]:
    """Every revision this code's migrations know, oldest first (each one's
    ``down_revision`` before it), read from the migration files' ``revision`` lines
    without loading Alembic (``0009_pauses_and_dedup.py`` is revision ``0009``)."""
    parent_of: dict[str, str | None] = {}
    for path in (MIGRATIONS / "versions").glob("*_*.py"):
        found: dict[str, str] = {
            match.group(1): match.group(2) for match in _REVISION_LINE.finditer(path.read_text())
        }
        if "revision" in found:
            parent_of[found["revision"]] = found.get("down_revision")

    def depth(revision: str) -> int:
        steps, parent = 0, parent_of.get(revision)
        while parent is not None and steps <= len(parent_of):
            steps, parent = steps + 1, parent_of.get(parent)
        return steps

    return sorted(parent_of, key=lambda revision: (depth(revision), revision))


def is_newer(current: str | None) -> bool:
    """Whether ``current`` is a revision this code does not know: a newer release's."""
    return current is not None and current not in known_revisions()


def serves_this_code(engine: Engine) -> bool:
    """Whether a newer schema says it serves code as old as this
    (:mod:`jobs._store.schema_floor`): a newer release's migrations that only added."""
    floor = oldest_code(engine)
    known = known_revisions()
    return floor in known and known.index(floor) <= known.index(SCHEMA_REVISION)


def skew(engine: Engine, current: str | None, needed: str = SCHEMA_REVISION) -> str | None:
    """Why the job tables at ``current`` cannot serve this code, in one line naming both
    revisions and what to run, or None when they are at ``needed``."""
    if current == needed:
        return None
    where = engine.url.render_as_string(hide_password=True)
    if is_newer(current):
        if serves_this_code(engine):
            return None  # a rolling upgrade: the newer release only added to the schema
        return (
            f"the jobs schema in {where} is at {current}, newer than this code (it knows "
            f"up to {needed}) and no longer serves it: upgrade durable-jobs on this host to "
            "the release that wrote it; `jobctl db upgrade` never takes a schema back"
        )
    return (
        f"the jobs schema in {where} is at {current or 'nothing'}, this code needs "
        f"{needed}: run `jobctl db upgrade`"
    )


def refuse_newer(engine: Engine) -> bool:
    """Raise :class:`SettingsError` if the job tables are at a revision this code does not
    know and that does not serve it (Alembic would fail with a traceback on it); True when
    they are newer and serve it (there is nothing to upgrade)."""
    current = current_revision(engine)
    if not is_newer(current):
        return False
    message = skew(engine, current)
    if message is not None:
        raise SettingsError(message)
    return True


def alembic_config(engine: Engine) -> Config:
    """Alembic's configuration for our migrations against ``engine`` (no alembic.ini)."""
    config = alembic_config_module.Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option(
        "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def head_revision(engine: Engine) -> str:
    """The newest migration's revision (what ``jobctl db upgrade`` brings a database to)."""
    head = alembic_script.ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, read without loading Alembic (workers never need
    it); ``None`` for a database with no job tables yet."""
    with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
        try:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except DBAPIError:
            return None


#: The PostgreSQL advisory lock key that serializes upgrades ("jobs" in ASCII, then 1).
UPGRADE_LOCK_KEY = 0x6A6F627301


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the job tables to ``revision`` in one transaction (``jobctl db upgrade``).

    Several at once (every pod of a deployment running it at start) take turns: on
    PostgreSQL the transaction first takes an advisory lock, so the next one waits, then
    finds the schema at ``revision`` and does nothing (SQLite's ``BEGIN IMMEDIATE`` already
    serializes them)."""
    if refuse_newer(engine):
        return  # newer, and serving this code: a newer release's workers are rolling out
    config = alembic_config(engine)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": UPGRADE_LOCK_KEY})
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def ensure_schema(engine: Engine) -> None:
    """Check (PostgreSQL) or bring up to date (SQLite) the job tables; the revision the
    code needs is :data:`jobs._store.tables.SCHEMA_REVISION`, checked against Alembic's head
    by the test-suite, so a process whose schema is current never imports Alembic."""
    current = current_revision(engine)
    if engine.dialect.name == "sqlite":
        if current != SCHEMA_REVISION:
            upgrade(engine)  # refuses a newer schema in one line
        return
    message = skew(engine, current)
    if message is not None:
        raise SettingsError(message)
