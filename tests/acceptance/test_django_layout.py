"""Celery's own Django layout (tests/celery_layouts.py: ``proj/__init__.py`` imports the app,
``app.autodiscover_tasks()``, the kinds in ``demoapp/tasks.py``) with durable jobs installed
and no ``JOBS_IMPORTS``: every process of the project knows the kinds, as its workers know
its plain tasks, on RabbitMQ and PostgreSQL of the test's own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from jobs.core.states import State
from tests.acceptance.test_celery_project import Project, project_world
from tests.celery_layouts import write_django_project

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


@pytest.fixture
def django_project(pg_admin: Engine, amqp_url: str, tmp_path: Path) -> Iterator[Project]:
    folder = write_django_project(tmp_path / "project")
    with project_world(pg_admin, amqp_url, tmp_path, folder) as running:
        yield running


def manage(project: Project, *args: str) -> str:
    """``python manage.py …`` in the project's folder."""
    return project.run(
        "import sys; from django.core.management import execute_from_command_line\n"
        f"sys.argv = ['manage.py', *{list(args)!r}]\n"
        "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'proj.settings')\n"
        "execute_from_command_line(sys.argv)"
    )


WEB_PROCESS = (
    "import os\n"
    "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'proj.settings')\n"
    "import django\n"
    "django.setup()\n"  # what a WSGI server's get_wsgi_application() does
)


def test_a_shell_and_a_web_process_know_the_autodiscovered_kinds_without_jobs_imports(
    django_project: Project,
) -> None:
    # manage.py shell: the kind by name, its module never imported by the caller.
    job_id = manage(
        django_project,
        "shell",
        "-c",
        "import jobs; print(jobs.submit('check_order', {'order_id': 42}))",
    ).splitlines()[-1]
    assert django_project.job(job_id).state is State.QUEUED
    # A web process: the kind by name, then app.tasks lists its task.
    said = django_project.run(
        WEB_PROCESS + "import jobs\n"
        "from proj import celery_app\n"
        "print(jobs.submit('check_order', {'order_id': 43}))\n"
        "print('jobs.check_order' in celery_app.tasks)\n"
    ).splitlines()
    assert said[-1] == "True"
    assert django_project.job(said[-2]).kind == "check_order"
    # A view that imports the kind's module: app.tasks knows the kind's task at once.
    said = django_project.run(
        WEB_PROCESS + "from demoapp.tasks import check_order\n"
        "from proj import celery_app\n"
        "print(celery_app.tasks['jobs.check_order'].name)\n"
    ).splitlines()
    assert said[-1] == "jobs.check_order"


def test_the_projects_worker_runs_a_kind_submitted_from_a_shell(
    django_project: Project,
) -> None:
    worker = django_project.start(
        "worker",
        *(sys.executable, "-m", "celery", "-A", "proj", "worker", "-Q", "celery,jobs"),
        *("-c", "1", "--hostname", "django@%h", "-l", "INFO"),
    )
    worker.wait_ready()
    job_id = manage(
        django_project,
        "shell",
        "-c",
        "import jobs; print(jobs.submit('check_order', {'order_id': 7}))",
    ).splitlines()[-1]
    done = django_project.wait_state(job_id, State.COMPLETED)
    assert done.result == {"order_id": 7, "ok": True}
