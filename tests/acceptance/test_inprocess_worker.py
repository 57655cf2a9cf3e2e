"""Scenario 11: Celery's own in-process test worker runs the real ``jobs.run`` task.

pytest-celery 1.x registers itself under the entry point name ``celery``
(``pytest_celery.plugin``) and re-exports ``celery.contrib.pytest``: the thread-worker
fixtures ``celery_session_app``/``celery_session_worker`` still work, while its own
``celery_worker`` fixture is a Docker container (there is no Docker engine here, and
nothing here requests it; the Docker fixtures are only built when requested, so they do
not break collection). No root conftest or ``-p`` option is needed.

The session fixtures below configure the session app exactly as ``jobs.celery_app`` is
configured (JSON only, acks_late, reject on worker lost …) for a session queue on
RabbitMQ, and install the job runner on it as on any user's app, with the very code the
daemon runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import jobs.examples.check_order  # noqa: F401 - registers the job kinds in this process
from jobs._config.settings import from_env
from jobs._core.records import Batch
from jobs._core.states import State
from jobs._worker import celery_setup as jobs_celery
from jobs._worker.installed import installed_on
from jobs.application import default_app
from tests.acceptance.conftest import (
    PG_RABBITMQ,
    Stack,
    assert_recorded_steps_ran_once,
    delete_rabbit_queue,
    owner_pid,
)

pytestmark = pytest.mark.acceptance

SESSION_QUEUE = f"acc-inproc-{uuid.uuid4().hex[:12]}"
NODE = f"inproc-{uuid.uuid4().hex[:6]}@localhost"


@pytest.fixture(scope="session")
def session_queue(amqp_url: str) -> Iterator[str]:
    """The in-process worker's queue, deleted after the worker stopped (session end)."""
    yield SESSION_QUEUE
    delete_rabbit_queue(amqp_url, SESSION_QUEUE)


@pytest.fixture(scope="session")
def celery_config(
    amqp_url: str, session_queue: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    settings = from_env(
        {
            "JOBS_BROKER_URL": amqp_url,
            "JOBS_QUEUE": session_queue,
            "JOBS_DATA_DIR": str(tmp_path_factory.mktemp("inproc")),
        }
    )
    return jobs_celery.celery_config(settings)


@pytest.fixture(scope="session")
def celery_session_app(celery_session_app: Any) -> Any:
    """Celery's session app, with the job runner of the default application installed."""
    jobs_celery.install_runner(celery_session_app, default_app())
    return celery_session_app


@pytest.fixture(scope="session")
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": [SESSION_QUEUE], "hostname": NODE, "perform_ping_check": False}


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_in_process_worker_runs_check_order(stack: Stack, celery_session_worker: Any) -> None:
    stack.configure(JOBS_QUEUE=SESSION_QUEUE)
    assert celery_session_worker.hostname == NODE
    installed = installed_on(celery_session_worker.app)
    assert installed is not None
    assert installed.host is default_app()
    assert jobs_celery.TASK_NAME in celery_session_worker.app.tasks
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.1})
    job = stack.wait_state(job_id, timeout=30)

    assert job.state is State.COMPLETED, job
    assert job.result == {"order_id": 42, "ok": True, "approved_by": None}
    # A thread of this very process ran it. (Celery's test worker traces tasks without
    # the daemon's fast path, so request.hostname is the machine's name, not the node's.)
    assert owner_pid(job.owner) == os.getpid(), job.owner
    assert [t.to_state for t in stack.history(job_id)] == [
        State.QUEUED,
        State.RUNNING,
        State.COMPLETED,
    ]
    assert assert_recorded_steps_ran_once(stack, job_id) == {"lookup_order": 1, "check_payment": 1}
    assert {pid for _effect, pid in stack.effects(job_id)} == {os.getpid()}
    stack.wait_queue_empty()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_in_process_worker_drops_a_duplicate(stack: Stack, celery_session_worker: Any) -> None:
    """A second test on a second fresh database through the same in-process worker: the
    worker process must not keep using the first database's liveness connection."""
    stack.configure(JOBS_QUEUE=SESSION_QUEUE)
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.1})
    assert stack.wait_state(job_id, timeout=30).state is State.COMPLETED
    default_app().runtime.ring_batch(Batch((job_id,)))
    stack.wait_queue_empty()
    assert [t.to_state for t in stack.history(job_id)] == [
        State.QUEUED,
        State.RUNNING,
        State.COMPLETED,
    ]
    assert assert_recorded_steps_ran_once(stack, job_id) == {"lookup_order": 1, "check_payment": 1}
