"""Celery's own Django layout (``examples/django`` of Celery's source distribution), written
into a folder for a test: ``proj/__init__.py`` imports the app, ``proj/celery.py`` configures
it from Django's settings and calls ``app.autodiscover_tasks()``, and ``demoapp/tasks.py``
(found by autodiscovery) holds Celery's ``shared_task`` examples beside durable kinds. The
only lines added to Celery's files are ``install(app)`` and the kinds."""

from __future__ import annotations

import textwrap
from pathlib import Path

CELERY_PY = """
import os

from celery import Celery

import jobs.contrib.celery

# Set the default Django settings module for the 'celery' program.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
{app_lines}
# Load task modules from all registered Django apps.
app.autodiscover_tasks()

jobs.contrib.celery.install(app)


@app.task(bind=True, ignore_result=True)
def debug_task(self):
    print(f"Request: {{self.request!r}}")
"""

INIT_PY = """
# This will make sure the app is always imported when
# Django starts so that shared_task will use this app.
from .celery import app as celery_app

__all__ = ("celery_app",)
"""

SETTINGS_PY = """
import os

BASE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET_KEY = "tests"
DEBUG = True
ALLOWED_HOSTS = []
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "demoapp",
]
DATABASES = {{
    "default": {{
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(BASE_DIR, "db.sqlite3"),
    }}
}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"]
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
{settings_lines}
"""

MODELS_PY = """
from django.db import models


class Widget(models.Model):
    name = models.CharField(max_length=140)
"""

TASKS_PY = """
# Create your tasks here

from celery import shared_task

import jobs
from demoapp.models import Widget  # noqa: F401 - as Celery's example: needs Django set up


@shared_task
def add(x, y):
    return x + y


@jobs.job("check_order")
def check_order(ctx, order_id):
    return ctx.step("check", lambda: {{"order_id": order_id, "ok": True}})

{tasks_lines}
"""

MANAGE_PY = """
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""


def write_django_project(
    folder: Path, *, app_lines: str = "", settings_lines: str = "", tasks_lines: str = ""
) -> Path:
    """Write the layout into ``folder`` (extra lines for ``proj/celery.py`` after the
    configuration, for the settings, for ``demoapp/tasks.py``) and return it."""
    files = {
        "manage.py": MANAGE_PY,
        "proj/__init__.py": INIT_PY,
        "proj/celery.py": CELERY_PY.format(app_lines=app_lines),
        "proj/settings.py": SETTINGS_PY.format(settings_lines=settings_lines),
        "demoapp/__init__.py": "",
        "demoapp/models.py": MODELS_PY,
        "demoapp/tasks.py": TASKS_PY.format(tasks_lines=tasks_lines),
    }
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return folder
