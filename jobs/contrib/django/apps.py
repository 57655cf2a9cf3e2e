"""The Django app: reads ``settings.JOBS`` and wraps job handlers for the ORM."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.conf import settings
from django.db import connections
from django.db.models.signals import post_migrate
from sqlalchemy.engine import URL

from jobs._config.settings import as_env
from jobs._core.errors import SettingsError
from jobs._core.lazy import lazy_module
from jobs.application import default_app, reset
from jobs.contrib.django.ambient import joining_django_transactions
from jobs.contrib.django.step_transactions import django_step_transactions

if TYPE_CHECKING:
    from jobs._store import schema
else:
    schema = lazy_module("jobs._store.schema")  # Alembic, on first use


def database_url(alias: str = "default") -> str:
    """A SQLAlchemy URL for one of Django's databases (PostgreSQL or SQLite)."""
    config = connections.settings.get(alias)
    if config is None:
        raise SettingsError(f"settings.DATABASES has no {alias!r} database")
    engine = str(config.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        name = str(config.get("NAME") or "")
        if name in ("", ":memory:") or name.startswith("file:"):
            raise SettingsError(f"DATABASES[{alias!r}]: jobs need a SQLite file, not {name!r}")
        return f"sqlite:///{Path(name).absolute()}"
    if engine.endswith(("postgresql", "postgis")):
        return URL.create(
            "postgresql+psycopg",
            username=config.get("USER") or None,
            password=config.get("PASSWORD") or None,
            host=config.get("HOST") or None,
            port=int(config["PORT"]) if config.get("PORT") else None,
            database=config.get("NAME") or None,
        ).render_as_string(hide_password=False)
    raise SettingsError(f"DATABASES[{alias!r}]: jobs support PostgreSQL and SQLite, not {engine}")


def settings_env() -> Mapping[str, str]:
    """``settings.JOBS`` as ``JOBS_*`` variables; without ``DATABASE_URL``, Django's
    ``default`` database."""
    values: dict[str, Any] = dict(getattr(settings, "JOBS", None) or {})
    env = as_env(values, "settings.JOBS")
    if "JOBS_DATABASE_URL" not in env:
        env["JOBS_DATABASE_URL"] = database_url("default")
    return env


@contextlib.contextmanager
def fresh_connections() -> Iterator[None]:
    """Around each job, what Django does around each request: close connections that are
    broken or past ``CONN_MAX_AGE``, so a handler never inherits a dead one. A connection
    inside ``atomic()`` (a test's transaction running jobs in-process) is left alone."""
    _close_stale()
    try:
        yield
    finally:
        _close_stale()


def _close_stale() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


class JobsConfig(AppConfig):
    """``INSTALLED_APPS = [..., "jobs.contrib.django"]``."""

    name = "jobs.contrib.django"
    label = "durable_jobs"
    verbose_name = "Durable jobs"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        default_app().set_defaults_source(settings_env, "settings.JOBS")
        default_app().registry.add_job_scope(fresh_connections)
        # A plain jobs.submit (or .delay()) inside atomic() on the jobs' database joins it.
        default_app().transactions.join_from(joining_django_transactions(database_url))
        # An atomic step runs in atomic() on the jobs' database, its record on that connection.
        default_app().registry.open_steps_with(django_step_transactions(database_url))
        post_migrate.connect(upgrade_job_tables, sender=self)


def upgrade_job_tables(using: str = "default", **_: Any) -> None:
    """After ``manage.py migrate``: bring the job tables to head with their own Alembic
    migrations (what ``jobctl db upgrade`` does), once, for the database they live in.
    Django's migrations never touch them."""
    if using != "default":
        return
    default_app().reset_settings()  # the test runner renames the database before it migrates
    reset()
    schema.upgrade(default_app().runtime.engine)
