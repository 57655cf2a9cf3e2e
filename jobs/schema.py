"""Schema management: Alembic migrations shipped inside the package.

The embedded default (SQLite) upgrades itself on first use so ``import jobs`` just
works on a laptop; a shared PostgreSQL is upgraded only by ``jobctl db upgrade``, and
a process that finds it behind stops with a message saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from jobs.core.db import READ_ONLY
from jobs.core.errors import SettingsError
from jobs.core.models import SCHEMA_REVISION

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    """Alembic's configuration for our migrations against ``engine`` (no alembic.ini)."""
    from alembic.config import Config  # noqa: PLC0415 - Alembic only to migrate

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option(
        "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def head_revision(engine: Engine) -> str:
    """The newest migration's revision (what ``jobctl db upgrade`` brings a database to)."""
    from alembic.script import ScriptDirectory  # noqa: PLC0415

    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
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
    from alembic import command  # noqa: PLC0415

    config = alembic_config(engine)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": UPGRADE_LOCK_KEY})
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def ensure_schema(engine: Engine) -> None:
    """Check (PostgreSQL) or bring up to date (SQLite) the job tables; the revision the
    code needs is :data:`jobs.core.models.SCHEMA_REVISION`, checked against Alembic's head
    by the test-suite, so a process whose schema is current never imports Alembic."""
    current, head = current_revision(engine), SCHEMA_REVISION
    if engine.dialect.name == "sqlite":
        if current != head:
            upgrade(engine)
        return
    if current != head:
        raise SettingsError(
            f"the jobs schema in {engine.url.render_as_string(hide_password=True)} is at "
            f"{current or 'nothing'}, this code needs {head}: run `jobctl db upgrade`"
        )
