"""What the jobs_* management commands share: run a ``jobctl`` command with the Django
project's settings, passing ``settings.JOBS`` on as ``JOBS_*`` variables (which the
``celery worker`` that ``jobctl worker`` becomes inherits; there Celery's Django fix-up
calls ``django.setup()`` before the job modules are imported)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from jobs.application import default_app
from jobs.contrib.django.apps import settings_env


def export_settings() -> None:
    """``settings.JOBS`` into the environment (set variables win), and the project's
    folder onto ``PYTHONPATH`` so a worker started elsewhere imports the same modules."""
    for name, value in settings_env().items():
        os.environ.setdefault(name, value)
    top = importlib.import_module(str(settings.SETTINGS_MODULE).split(".")[0])
    folder = str(Path(str(top.__file__)).parent.parent)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if folder not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([folder, *paths])
    default_app().reset_settings()


class JobctlCommand(BaseCommand):
    """A management command that runs ``jobctl <command> [arguments ...]``; without a
    ``jobctl_command`` (``manage.py jobs``), the first argument names it."""

    jobctl_command = ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("arguments", nargs=argparse.REMAINDER, help="jobctl's options")

    def run_from_argv(self, argv: list[str]) -> None:
        # jobctl parses its own options (and prints its own --help).
        self.execute(*argv[2:], no_color=False, force_color=False, skip_checks=True)

    def execute(self, *args: Any, **options: Any) -> None:
        from jobs.cli import main  # noqa: PLC0415

        export_settings()
        arguments = list(options.get("arguments") or args)
        command = [self.jobctl_command] if self.jobctl_command else []
        sys.stdout.flush()
        # jobctl prints a user's mistake as one line and exits 1; a worker execs Celery.
        main.main([*command, *arguments], prog_name="manage.py" if command else "manage.py jobs")

    def handle(self, *args: Any, **options: Any) -> None:  # pragma: no cover - execute runs
        raise NotImplementedError
