"""Set up the web framework a worker's job modules belong to, before importing them.

A ``JOBS_IMPORTS`` module of a Django project imports its models, which Django refuses until
``django.setup()`` has run (``AppRegistryNotReady``). Celery's own Django fix-up sets Django
up for a worker when ``DJANGO_SETTINGS_MODULE`` is set, but later than we import the job
modules; this does it first, the same way, so ``jobctl worker`` works in a Django project as
``manage.py jobs_worker`` does.
"""

from __future__ import annotations

import importlib
import os


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
