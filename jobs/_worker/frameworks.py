"""Set up the web framework a process's job settings and job modules belong to.

A ``JOBS_IMPORTS`` module of a Django project imports its models, which Django refuses until
``django.setup()`` has run (``AppRegistryNotReady``). Celery's own Django fix-up sets Django
up for a worker when ``DJANGO_SETTINGS_MODULE`` is set, but later than we import the job
modules; this does it first, the same way, so ``jobctl worker`` works in a Django project as
``manage.py jobs_worker`` does. Setting Django up (``jobs.contrib.django`` in
``INSTALLED_APPS``) or loading a Flask app (``jobs.contrib.flask.Jobs(app)``) also supplies
their settings (``settings.JOBS``, ``app.config``) to the default app: how ``jobctl`` reads
the settings the app uses.
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def set_up_for_job_modules() -> None:
    """``django.setup()`` when ``DJANGO_SETTINGS_MODULE`` names a project whose apps are not
    loaded yet (a web process's are: setting up again would redo its logging); otherwise
    nothing."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return
    apps = importlib.import_module("django.apps").apps
    if apps.ready or apps.loading:
        return
    django = importlib.import_module("django")
    django.setup()


def load_flask_app(name: str) -> Any:
    """The Flask app ``name`` names, found as ``flask --app NAME`` finds it (``module``,
    ``module:app``, ``module:create_app()``, a file's path); its import runs the app's
    ``Jobs(app)``. Flask's ``NoAppException`` says what was wrong."""
    flask_cli = importlib.import_module("flask.cli")  # Flask is an optional dependency
    return flask_cli.ScriptInfo(app_import_path=name, load_dotenv_defaults=False).load_app()
