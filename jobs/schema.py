"""Schema management: Alembic migrations shipped inside the package.

The embedded default (SQLite) upgrades itself on first use so ``import jobs`` just
works on a laptop; a shared PostgreSQL is upgraded only by ``jobctl db upgrade``, and
a process that finds it behind stops with a message saying so.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from jobs.core.errors import SettingsError

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option(
        "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def head_revision(engine: Engine) -> str:
    head = ScriptDirectory.from_config(alembic_config(engine)).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    config = alembic_config(engine)
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def ensure_schema(engine: Engine) -> None:
    if engine.dialect.name == "sqlite":
        if current_revision(engine) != head_revision(engine):
            upgrade(engine)
        return
    current, head = current_revision(engine), head_revision(engine)
    if current != head:
        raise SettingsError(
            f"the jobs schema in {engine.url.render_as_string(hide_password=True)} is at "
            f"{current or 'nothing'}, this code needs {head}: run `jobctl db upgrade`"
        )
