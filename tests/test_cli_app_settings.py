"""``jobctl``, ``manage.py jobs`` and ``flask jobs`` read the settings the app uses, run as
an operator runs them: real processes, in a copy of the example Django project and of the
example Flask app, on SQLite and on PostgreSQL. And the set-ups that used to answer from the
wrong place (an empty database of jobctl's own, a doorbell rung into a folder no worker
reads) stop with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import AMQP_URL, error_line, private_pg_database

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent
JOBCTL = str(BIN / "jobctl")
FLASK = str(BIN / "flask")

SQLITE = "sqlite"
POSTGRES = pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.rabbitmq])


@dataclass
class Project:
    """A copy of an example app in its own folder, and the environment to run it in."""

    folder: Path
    env: dict[str, str]

    def run(self, *command: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(command),
            cwd=self.folder,
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def ok(self, *command: str, **extra: str) -> str:
        out = self.run(*command, **extra)
        assert out.returncode == 0, (command, out.stdout, out.stderr)
        return out.stdout

    @property
    def own_database(self) -> Path:
        """Where jobctl made a database of its own when it ignored the app's settings."""
        return self.folder / "jobs-data" / "jobs.sqlite3"


def plain_env() -> dict[str, str]:
    """This environment without any jobs or framework setting."""
    dropped = ("JOBS_", "DJANGO_SETTINGS_MODULE", "FLASK_APP")
    env = {key: value for key, value in os.environ.items() if not key.startswith(dropped)}
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture
def shop_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The shop's database (``SHOP_DATABASE_URL``): a SQLite file, or a fresh PostgreSQL
    database with RabbitMQ for the doorbells (on a queue of this test's, deleted after)."""
    if request.param == SQLITE:
        yield {"SHOP_DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}"}
        return
    queue = f"cli-{uuid.uuid4().hex[:12]}"
    with private_pg_database("jobs_cli") as url:
        try:
            yield {"SHOP_DATABASE_URL": url, "JOBS_BROKER_URL": AMQP_URL, "JOBS_QUEUE": queue}
        finally:
            delete_queue(queue)


def delete_queue(queue: str) -> None:
    import kombu  # noqa: PLC0415 - only the PostgreSQL cases ring RabbitMQ

    with kombu.Connection(AMQP_URL) as connection:
        connection.default_channel.queue_delete(queue)


@pytest.fixture
def django_project(tmp_path: Path, shop_database: dict[str, str]) -> Project:
    """The example Django shop, migrated (the job tables with it)."""
    shutil.copytree(EXAMPLES / "django", tmp_path / "site")
    env = {**plain_env(), **shop_database, "DJANGO_SETTINGS_MODULE": "shop.settings"}
    project = Project(tmp_path / "site", env)
    project.ok(sys.executable, "manage.py", "migrate", "-v0")
    return project


def submitted_from_a_shell(project: Project) -> str:
    """A job submitted as the project's code submits it (``manage.py shell``)."""
    code = "import jobs; print(jobs.submit('check_shop_order', {'order_id': 1}))"
    return project.ok(sys.executable, "manage.py", "shell", "-c", code).split()[-1]


def state_of(project: Project, *jobctl: str, job_id: str) -> str:
    shown = json.loads(project.ok(*jobctl, "show", job_id, "--json"))
    assert shown["id"] == job_id
    return str(shown["state"])


@pytest.mark.parametrize("shop_database", [SQLITE, POSTGRES], indirect=True)
def test_jobctl_in_a_django_project_reads_settings_jobs_and_databases(
    django_project: Project,
) -> None:
    """It used to ignore them: ``no jobs``, ``unknown job id``, and a new empty
    ``jobs-data/jobs.sqlite3`` in the project folder."""
    job_id = submitted_from_a_shell(django_project)

    listed = django_project.ok(JOBCTL, "list")
    explained = django_project.ok(JOBCTL, "explain", job_id, "--no-workers")
    assert job_id in listed
    assert f"Job {job_id} (check_shop_order) is QUEUED" in explained
    django_project.ok(JOBCTL, "cancel", job_id)
    assert state_of(django_project, JOBCTL, job_id=job_id) == "CANCELLED"
    django_project.ok(JOBCTL, "retry", job_id)
    assert state_of(django_project, JOBCTL, job_id=job_id) == "QUEUED"
    limits = json.loads(django_project.ok(JOBCTL, "limits", "--json"))
    assert limits["check_shop_order"]["max_queued"] == 20  # the kind, from settings.JOBS
    assert "dead owners re-queued: 0" in django_project.ok(JOBCTL, "sweeper", "--once")
    assert not django_project.own_database.exists()


@pytest.mark.parametrize("shop_database", [SQLITE, POSTGRES], indirect=True)
def test_manage_py_jobs_runs_every_jobctl_command(django_project: Project) -> None:
    manage = (sys.executable, "manage.py")
    job_id = django_project.ok(
        *manage, "jobs", "submit", "check_shop_order", "--input", '{"order_id": 2}'
    ).strip()

    assert job_id in django_project.ok(*manage, "jobs", "list", "--kind", "check_shop_order")
    explained = django_project.ok(*manage, "jobs", "explain", job_id, "--no-workers")
    assert f"Job {job_id} (check_shop_order) is QUEUED" in explained
    django_project.ok(*manage, "jobs", "cancel", job_id, "--reason", "by hand")
    assert state_of(django_project, *manage, "jobs", job_id=job_id) == "CANCELLED"
    assert "jobs: 1" in django_project.ok(*manage, "jobs_stats")  # the old commands stay
    assert "list" in django_project.ok(*manage, "jobs", "--help")
    error_line(django_project.run(*manage, "jobs", "show", "nope"), "unknown job id 'nope'")
    assert not django_project.own_database.exists()


CELERY_MODULE = """
import os

from celery import Celery

import jobs.contrib.celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
app = Celery("shop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
jobs.contrib.celery.install(app)
"""


@pytest.mark.parametrize("shop_database", [SQLITE], indirect=True)
def test_jobctl_with_a_django_projects_celery_app_reads_the_django_settings(
    django_project: Project,
) -> None:
    """Celery's Django layout: ``JOBS_CELERY_APP`` alone, the app's module naming the settings
    (Celery's Django fix-up sets Django up when the app imports its task modules). The
    settings used to be read before that, without ``settings.JOBS`` and ``DATABASES``."""
    (django_project.folder / "shop" / "celery.py").write_text(CELERY_MODULE)
    job_id = submitted_from_a_shell(django_project)
    env = {
        key: value for key, value in django_project.env.items() if key != "DJANGO_SETTINGS_MODULE"
    }
    celery_project = Project(django_project.folder, {**env, "JOBS_CELERY_APP": "shop.celery:app"})

    assert job_id in celery_project.ok(JOBCTL, "list")
    explained = celery_project.ok(JOBCTL, "explain", job_id, "--no-workers")
    assert f"Job {job_id} (check_shop_order) is QUEUED" in explained
    assert not celery_project.own_database.exists()


@pytest.fixture
def flask_project(tmp_path: Path, shop_database: dict[str, str]) -> Project:
    """The example Flask shop (its module makes the app and the job tables)."""
    shutil.copy(EXAMPLES / "flask" / "shop_flask.py", tmp_path)
    env = {**plain_env(), **shop_database, "JOBS_DATA_DIR": str(tmp_path / "shop-data")}
    return Project(tmp_path, env)


@pytest.mark.parametrize("shop_database", [SQLITE, POSTGRES], indirect=True)
def test_flask_jobs_runs_every_jobctl_command(flask_project: Project) -> None:
    flask = (FLASK, "--app", "shop_flask", "jobs")
    job_id = flask_project.ok(
        *flask, "submit", "check_flask_order", "--input", '{"order_id": 3}'
    ).strip()

    assert job_id in flask_project.ok(*flask, "list")
    explained = flask_project.ok(*flask, "explain", job_id, "--no-workers")
    assert f"Job {job_id} (check_flask_order) is QUEUED" in explained
    flask_project.ok(*flask, "cancel", job_id)
    assert state_of(flask_project, *flask, job_id=job_id) == "CANCELLED"
    assert "sweeper" in flask_project.ok(*flask, "--help")
    error_line(flask_project.run(*flask, "show", "nope"), "unknown job id 'nope'")
    assert not flask_project.own_database.exists()
    assert not (flask_project.folder / "shop-data" / "jobs.sqlite3").exists()


@pytest.mark.parametrize("shop_database", [SQLITE, POSTGRES], indirect=True)
def test_jobctl_with_flask_app_reads_the_apps_config(flask_project: Project) -> None:
    code = "import jobs, shop_flask; print(jobs.submit('check_flask_order', {'order_id': 4}))"
    job_id = flask_project.ok(sys.executable, "-c", code).split()[-1]
    app = {"FLASK_APP": "shop_flask"}

    assert job_id in flask_project.ok(JOBCTL, "list", **app)
    flask_project.ok(JOBCTL, "cancel", job_id, **app)
    shown = json.loads(flask_project.ok(JOBCTL, "show", job_id, "--json", **app))
    assert shown["state"] == "CANCELLED"
    assert not (flask_project.folder / "shop-data" / "jobs.sqlite3").exists()
    missing = flask_project.run(JOBCTL, "list", FLASK_APP="no_such_app")
    error_line(missing, "FLASK_APP='no_such_app': cannot load it")


KINDS = """
import jobs

@jobs.job("cli_echo")
def cli_echo(ctx, text):
    return text
"""


@pytest.fixture
def plain_project(tmp_path: Path) -> Project:
    """A folder with a kinds module and no settings at all."""
    (tmp_path / "cli_kinds.py").write_text(KINDS)
    return Project(tmp_path, {**plain_env(), "JOBS_IMPORTS": "cli_kinds"})


def test_reading_jobs_on_a_sqlite_database_that_does_not_exist_says_so(
    plain_project: Project,
) -> None:
    """``jobctl list`` used to create ``./jobs-data/jobs.sqlite3`` and answer ``no jobs``."""
    for command in (["list"], ["show", "a1"], ["explain", "a1"], ["stats"], ["retry", "a1"]):
        error_line(
            plain_project.run(JOBCTL, *command),
            f"no jobs database at {plain_project.own_database}",
        )
    assert not plain_project.own_database.exists()
    plain_project.ok(JOBCTL, "submit", "cli_echo", "--input", '{"text": "hi"}')
    assert "cli_echo" in plain_project.ok(JOBCTL, "list")  # a submit makes it, as before


@pytest.mark.postgres
def test_a_postgresql_database_with_the_filesystem_broker_is_refused(
    plain_project: Project,
) -> None:
    """``jobctl retry`` used to ring the doorbell into ``jobs-data/broker``, which no
    worker on another host reads, and say nothing."""
    with private_pg_database("jobs_cli") as url:
        env = {"JOBS_DATABASE_URL": url}
        plain_project.ok(JOBCTL, "db", "upgrade", **env)  # the schema needs no broker
        code = (
            "import jobs, cli_kinds; from jobs.application import default_app; "
            "default_app().use_doorbell(None); job_id = jobs.submit('cli_echo', {'text': 1}); "
            "jobs.cancel(job_id, reason='test'); print(job_id)"
        )
        job_id = plain_project.ok(sys.executable, "-c", code, **env).strip()

        for command in (["retry", job_id], ["submit", "cli_echo"], ["list"]):
            error_line(
                plain_project.run(JOBCTL, *command, **env),
                "JOBS_BROKER_URL is not set",
                "127.0.0.1:5432",
            )
        explicit = plain_project.run(
            JOBCTL, "retry", job_id, **env, JOBS_BROKER_URL="filesystem://"
        )
        error_line(explicit, "JOBS_BROKER_URL is filesystem://")
        assert not (plain_project.folder / "jobs-data" / "broker").exists()
        assert "CANCELLED" in plain_project.ok(
            JOBCTL, "show", job_id, **env, JOBS_BROKER_URL=AMQP_URL
        )


def test_django_settings_that_give_jobs_no_database_are_refused(plain_project: Project) -> None:
    """A settings module without ``jobs.contrib.django`` in ``INSTALLED_APPS`` (and no
    ``JOBS_DATABASE_URL``): jobctl would have read and written a database of its own."""
    (plain_project.folder / "bare_settings.py").write_text(
        'SECRET_KEY = "tests"\nINSTALLED_APPS = ["django.contrib.contenttypes"]\n'
    )
    env = {"DJANGO_SETTINGS_MODULE": "bare_settings"}
    for command in (["list"], ["submit", "cli_echo"]):
        error_line(
            plain_project.run(JOBCTL, *command, **env),
            "DJANGO_SETTINGS_MODULE='bare_settings' gives durable jobs no settings",
            "INSTALLED_APPS",
        )
    assert not plain_project.own_database.exists()
    missing = plain_project.run(JOBCTL, "list", DJANGO_SETTINGS_MODULE="no_such_settings")
    error_line(missing, "DJANGO_SETTINGS_MODULE='no_such_settings': cannot load it")
