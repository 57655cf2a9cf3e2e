"""Where ``jobctl`` finds the settings the app uses, before any of its commands runs.

- ``DJANGO_SETTINGS_MODULE`` set: Django is set up, and ``jobs.contrib.django`` supplies
  ``settings.JOBS`` and the ``default`` database (as ``manage.py jobs`` does).
- ``FLASK_APP`` set: the Flask app is loaded, and its ``Jobs(app)`` supplies its
  ``app.config`` and Flask-SQLAlchemy's database (as ``flask jobs`` does).
- ``JOBS_CELERY_APP`` set: the project's Celery app is imported (its broker carries the
  doorbells, and Celery's Django fix-up sets Django up) before the settings are read.

``JOBS_*`` environment variables win over all of them. Two set-ups that would quietly
answer from the wrong place stop the command with one line instead: a framework that gives
durable jobs no database, and a PostgreSQL database with the filesystem broker (whose
folder no worker on another host reads). A command that reads or changes existing jobs
on a SQLite database that does not exist says so rather than creating an empty one.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import click

from jobs._config.database_urls import describe_hosts
from jobs._config.settings import Settings
from jobs._core.errors import SettingsError
from jobs._core.validate import clip
from jobs._worker.frameworks import load_flask_app, set_up_for_job_modules
from jobs.application import JobsApp, default_app

#: Commands that read or change jobs already in the database: on a SQLite file that does
#: not exist they say so instead of creating it (and answering "no jobs").
NEEDS_EXISTING_JOBS = frozenset(
    {
        *("list", "show", "explain", "stats", "approve", "cancel", "retry", "wake"),
        *("send-event", "replay-check"),
    }
)

#: Commands that make a world of their own (their own folder, an in-memory database).
OWN_WORLD = frozenset({"demo", "simulate"})

#: Commands that never ring a doorbell: the broker the settings name does not matter.
NO_BROKER = frozenset({"db upgrade", "db current"})

EMBEDDED_BROKERS = ("filesystem://", "memory://")


def command_name(ctx: click.Context) -> str:
    """The command below ``jobctl`` that ``ctx`` runs: ``list``, ``limits set``."""
    names: list[str] = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names))


def read_the_app_settings(ctx: click.Context) -> None:
    """Find the app's settings for the command ``ctx`` runs and refuse the set-ups that
    would answer from the wrong place (a :class:`SettingsError`: one line, exit 1)."""
    name = command_name(ctx)
    if name in OWN_WORLD:
        return
    app = default_app()
    set_up_the_framework(app)
    app.import_celery_app()
    settings = app.settings
    if name not in NO_BROKER:
        refuse_an_unread_broker(app, settings)
    if name in NEEDS_EXISTING_JOBS:
        refuse_a_missing_database(settings)


def set_up_the_framework(app: JobsApp) -> None:
    """Set up the framework the environment names (Django first, then Flask), unless one
    has already supplied the settings (``manage.py jobs``, ``flask jobs``)."""
    if app.defaults_source_name is not None:
        return
    django_settings = os.environ.get("DJANGO_SETTINGS_MODULE", "").strip()
    flask_app = os.environ.get("FLASK_APP", "").strip()
    setting_up: Callable[[], object]
    if django_settings:
        where = f"DJANGO_SETTINGS_MODULE={django_settings!r}"
        hint = "add 'jobs.contrib.django' to INSTALLED_APPS"
        setting_up = set_up_for_job_modules
    elif flask_app:
        where = f"FLASK_APP={flask_app!r}"
        hint = "call jobs.contrib.flask.Jobs(app, db) when the app is made"
        setting_up = lambda: load_flask_app(flask_app)  # noqa: E731
    else:
        return
    try:
        setting_up()
    except Exception as err:  # whatever the project's settings or app module raises
        detail = " ".join(str(err).split())
        raise SettingsError(
            f"{where}: cannot load it: {type(err).__name__}: {clip(detail, 200)}"
        ) from None
    if app.defaults_source_name is None and not os.environ.get("JOBS_DATABASE_URL"):
        raise SettingsError(
            f"{where} gives durable jobs no settings, so jobctl would use a database of its "
            f"own: {hint}, or set JOBS_DATABASE_URL"
        )


def refuse_an_unread_broker(app: JobsApp, settings: Settings) -> None:
    """A PostgreSQL database serves workers on many hosts; the embedded broker is a folder
    on this one. Their pairing would ring every doorbell where no worker listens."""
    if not settings.database_url.startswith("postgresql"):
        return
    if not settings.broker_url.startswith(EMBEDDED_BROKERS) or app.doorbell_replaced:
        return
    chosen = "is" if os.environ.get("JOBS_BROKER_URL") else "is not set, so it is"
    raise SettingsError(
        f"the jobs database is a PostgreSQL server ({describe_hosts(settings.database_url)}) "
        f"but JOBS_BROKER_URL {chosen} {settings.broker_url}, a folder on this host that no "
        "other host's worker reads: set JOBS_BROKER_URL=amqp://USER:PASSWORD@HOST:5672/VHOST "
        "(or JOBS_CELERY_APP to the project's Celery app)"
    )


def refuse_a_missing_database(settings: Settings) -> None:
    """A SQLite jobs database that does not exist: there are no jobs to read or change,
    and creating an empty file where the app keeps none would hide the mistake."""
    if not settings.database_url.startswith("sqlite"):
        return
    path = sqlite_path(settings.database_url)
    if path.exists():
        return
    raise SettingsError(
        f"no jobs database at {path}: nothing was submitted with these settings "
        "(JOBS_DATABASE_URL or JOBS_DATA_DIR, DJANGO_SETTINGS_MODULE or FLASK_APP name the "
        "app's)"
    )


def sqlite_path(url: str) -> Path:
    """The file of a ``sqlite:///PATH`` URL (the settings refused every other form)."""
    path = urllib.parse.urlsplit(url).path
    return Path(urllib.parse.unquote(path[1:] if path.startswith("/") else path)).absolute()
