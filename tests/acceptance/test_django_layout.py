"""Celery's own Django layout (tests/celery_layouts.py: ``proj/__init__.py`` imports the app,
``app.autodiscover_tasks()``, the kinds in ``demoapp/tasks.py``) with durable jobs installed
and no ``JOBS_IMPORTS``: every process of the project knows the kinds, as its workers know
its plain tasks, on RabbitMQ and PostgreSQL of the test's own."""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from jobs._core.states import State
from tests.acceptance.conftest import Proc, wait_until
from tests.acceptance.tcp_proxy import TcpProxy
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


def test_app_tasks_lists_the_autodiscovered_kinds_at_its_first_read(
    django_project: Project,
) -> None:
    """A fresh web process (and a shell) whose first touch of durable jobs is reading
    ``app.tasks``: the app's task modules are imported as the app is finalized, so each
    kind's task is listed, beside the plain tasks autodiscovery finds."""
    said = django_project.run(
        WEB_PROCESS + "from proj import celery_app\n"
        "print(sorted(name for name in celery_app.tasks if name.startswith('jobs.')))\n"
        "print(celery_app.tasks['jobs.check_order'].name)\n"
        "print('demoapp.tasks.add' in celery_app.tasks)\n"
    ).splitlines()
    assert said[-3:] == ["['jobs.check_order', 'jobs.run']", "jobs.check_order", "True"]
    said = manage(
        django_project,
        "shell",
        "-c",
        "from proj import celery_app; print('jobs.check_order' in celery_app.tasks)",
    ).splitlines()
    assert said[-1] == "True"


def celery_worker(project: Project, name: str, *options: str) -> Proc:
    """``celery -A proj worker`` of the project, with ``options`` (``-Q …``) and no others."""
    proc = project.start(
        name,
        *(sys.executable, "-m", "celery", "-A", "proj", "worker", *options),
        *("-c", "1", "--hostname", f"{name}-{uuid.uuid4().hex[:6]}@%h", "-l", "INFO"),
    )
    proc.wait_ready(timeout=120)  # a loaded machine starts Django and Celery slowly
    return proc


def submit(project: Project, kind: str, inputs: dict[str, object], *imports: str) -> str:
    """A job submitted from ``manage.py shell`` (importing ``imports`` first)."""
    code = "".join(f"import {module}; " for module in imports)
    code += f"import jobs; print(jobs.submit({kind!r}, {inputs!r}))"
    return manage(project, "shell", "-c", code).splitlines()[-1]


def test_a_plain_worker_consumes_the_durable_queue_and_send_task_declares_it_alike(
    django_project: Project,
) -> None:
    # The queue exists as the doorbells declare it (a priority queue) before any worker.
    job_id = submit(django_project, "check_order", {"order_id": 7})
    # celery -A proj worker, no -Q: the app's queues, the durable ones among them.
    worker = celery_worker(django_project, "plain")
    done = django_project.wait_state(job_id, State.COMPLETED)
    assert done.result == {"order_id": 7, "ok": True}
    # A plain task sent to the durable queue by name declares it as everyone does.
    said = django_project.run(
        WEB_PROCESS + "from proj import celery_app\n"
        "print(celery_app.send_task('demoapp.tasks.add', args=(2, 3), queue='jobs').id)\n"
    ).splitlines()[-1]
    wait_until(
        lambda: f"[{said}] succeeded" in worker.output(),
        30,
        "the plain task sent to the durable queue to run",
        interval=0.2,
    )
    assert "PRECONDITION_FAILED" not in worker.output()


def test_a_worker_of_a_durable_queue_whose_kinds_it_does_not_import_starts_and_leaves_them(
    tmp_path: Path, pg_admin: Engine, amqp_url: str
) -> None:
    folder = write_django_project(tmp_path / "project")
    (folder / "demoapp" / "mail_jobs.py").write_text(  # not a task module of the app
        "import jobs\n\n\n@jobs.job('send_email', queue='email')\n"
        "def send_email(ctx, to):\n    return to\n"
    )
    with project_world(pg_admin, amqp_url, tmp_path, folder) as project:
        job_id = submit(project, "send_email", {"to": "a@example.com"}, "demoapp.mail_jobs")
        worker = celery_worker(project, "mail", "-Q", "email")  # ready: it consumes
        wait_until(
            lambda: "does not know kind 'send_email'" in worker.output(),
            30,
            "the worker to leave the job for a worker that knows its kind",
            interval=0.2,
        )
        assert "queue 'email' is not among the Celery app's queues" in worker.output()
        assert "PRECONDITION_FAILED" not in worker.output()
        job = project.job(job_id)
        assert (job.state, job.attempts) == (State.QUEUED, 0)


def test_a_project_whose_own_queue_is_called_jobs_runs_its_tasks_and_durable_jobs_there(
    tmp_path: Path, pg_admin: Engine, amqp_url: str
) -> None:
    folder = write_django_project(
        tmp_path / "project", settings_lines='CELERY_TASK_DEFAULT_QUEUE = "jobs"'
    )
    with project_world(pg_admin, amqp_url, tmp_path, folder) as project:
        # The project's queue exists as the project always declared it: no arguments.
        plain = project.run(
            WEB_PROCESS + "from demoapp.tasks import add\nprint(add.delay(2, 3).id)\n"
        ).splitlines()[-1]
        job_id = submit(project, "check_order", {"order_id": 8})
        worker = celery_worker(project, "own-jobs")
        assert project.wait_state(job_id, State.COMPLETED).result == {"order_id": 8, "ok": True}
        wait_until(
            lambda: f"[{plain}] succeeded" in worker.output(),
            30,
            "the project's plain task to run",
            interval=0.2,
        )
        assert "PRECONDITION_FAILED" not in worker.output()


def test_the_projects_worker_runs_a_kind_submitted_from_a_shell(
    django_project: Project,
) -> None:
    celery_worker(django_project, "django", "-Q", "celery,jobs")
    job_id = submit(django_project, "check_order", {"order_id": 7})
    done = django_project.wait_state(job_id, State.COMPLETED)
    assert done.result == {"order_id": 7, "ok": True}


PLAIN_JOBS_NAMED_TASK = """
@shared_task(name="jobs.sum_up")
def sum_up(numbers):
    return sum(numbers)
"""


def test_a_plain_task_named_like_a_kind_passes_untouched_with_its_result_delay_and_callback(
    tmp_path: Path, pg_admin: Engine, amqp_url: str
) -> None:
    folder = write_django_project(
        tmp_path / "project",
        settings_lines='CELERY_RESULT_BACKEND = "rpc://"',
        tasks_lines=PLAIN_JOBS_NAMED_TASK,
    )
    with project_world(pg_admin, amqp_url, tmp_path, folder) as project:
        worker = celery_worker(project, "plain")
        said = project.run(
            WEB_PROCESS + "import datetime\n"
            "from demoapp.tasks import add, sum_up\n"
            "print(sum_up.delay([1, 2, 3]).get(timeout=30))\n"
            "print(sum_up.apply_async(([4, 5],), countdown=1).get(timeout=30))\n"
            "eta = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=1)\n"
            "print(sum_up.apply_async(([6],), eta=eta).get(timeout=30))\n"
            "print(sum_up.apply_async(([7, 8],), link=add.s(100)).get(timeout=30))\n"
        ).splitlines()
        assert said[-4:] == ["6", "9", "6", "15"]
        wait_until(  # the callback ran with the task's result
            lambda: re.search(r"demoapp.tasks.add\[.*\] succeeded in .*: 115", worker.output()),
            30,
            "the callback to run",
            interval=0.2,
        )
        assert "dropped a message" not in worker.output()


def test_a_countdown_on_quorum_queues_keeps_celerys_delayed_delivery(
    tmp_path: Path, pg_admin: Engine, amqp_url: str
) -> None:
    folder = write_django_project(
        tmp_path / "project",
        # Celery's native delayed delivery: quorum queues behind a topic exchange.
        settings_lines='CELERY_TASK_DEFAULT_QUEUE_TYPE = "quorum"\n'
        'CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"',
    )
    with project_world(pg_admin, amqp_url, tmp_path, folder) as project:
        worker = celery_worker(project, "quorum")
        task_id = project.run(
            WEB_PROCESS + "from demoapp.tasks import add\n"
            "print(add.apply_async((2, 3), countdown=2).id)\n"
        ).splitlines()[-1]
        wait_until(
            lambda: f"[{task_id}] succeeded" in worker.output(),
            60,
            "the plain task with a countdown to run",
            interval=0.2,
        )
        job_id = submit(project, "check_order", {"order_id": 9})
        assert project.wait_state(job_id, State.COMPLETED).result == {"order_id": 9, "ok": True}


PROCESS_TASKS = """
@shared_task
def freeze_count():
    import gc

    return gc.get_freeze_count()
"""


def test_a_jobs_database_that_never_answers_delays_no_pool_child_and_no_plain_task(
    tmp_path: Path, pg_admin: Engine, amqp_url: str
) -> None:
    folder = write_django_project(tmp_path / "project")
    with project_world(pg_admin, amqp_url, tmp_path, folder) as project:
        database_url = project.env["JOBS_DATABASE_URL"]
        parsed = make_url(database_url)
        hung = TcpProxy((parsed.host or "127.0.0.1", parsed.port or 5432)).start()
        hung.cut()  # accepts connections, never answers
        try:
            # Plain tasks wait in their queue first: each pool child has one at its start.
            sent = project.run(
                WEB_PROCESS + "from demoapp.tasks import add\n"
                "for _ in range(4):\n    print(add.delay(2, 3).id)\n"
            ).splitlines()[-4:]
            project.env["JOBS_DATABASE_URL"] = hung.url_for(database_url)
            worker = celery_worker(project, "hung-db", "-c", "2")  # the durable queues too
            for task_id in sent:
                wait_until(
                    lambda task_id=task_id: f"[{task_id}] succeeded" in worker.output(),
                    60,
                    "a plain task to run while the jobs database hangs",
                    interval=0.2,
                )
            wait_until(
                lambda: "liveness lock not taken yet" in worker.output(),
                60,
                "a pool child's connect to the jobs database to give up",
                interval=0.2,
            )
            lines = worker.output().splitlines()
            # A child ran its plain task while its connect to the jobs database still hung.
            ran = [line for line in lines if "succeeded" in line]
            children = {re.findall(r"ForkPoolWorker-\d+", line)[0] for line in ran}
            for child in children:
                own = [line for line in lines if f"/{child}]" in line]
                first_success = next(i for i, line in enumerate(own) if "succeeded" in line)
                gave_up = [i for i, line in enumerate(own) if "liveness lock not taken" in line]
                assert not gave_up or first_success < gave_up[0], "\n".join(own)
            assert "Timed out waiting for UP message" not in worker.output()
        finally:
            hung.close()


def test_only_a_worker_that_runs_durable_jobs_changes_its_processes_and_says_so(
    tmp_path: Path, pg_admin: Engine, amqp_url: str
) -> None:
    folder = write_django_project(
        tmp_path / "project",
        settings_lines='CELERY_RESULT_BACKEND = "rpc://"',
        tasks_lines=PROCESS_TASKS,
    )
    with project_world(pg_admin, amqp_url, tmp_path, folder) as project:
        plain = celery_worker(project, "plain-only", "-Q", "celery")
        count = "from demoapp.tasks import freeze_count\n"
        count += "print(freeze_count.apply_async(queue={!r}).get(timeout=60))\n"
        assert project.run(WEB_PROCESS + count.format("celery")).splitlines()[-1] == "0"
        assert "runs durable jobs" not in plain.output()
        plain.terminate()
        plain.popen.wait(30)
        durable = celery_worker(project, "durable", "-Q", "celery,jobs")
        said = [line for line in durable.output().splitlines() if "runs durable jobs" in line]
        assert len(said) == 1
        assert "queues jobs" in said[0]
        assert int(project.run(WEB_PROCESS + count.format("celery")).splitlines()[-1]) > 0
