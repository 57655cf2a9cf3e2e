"""Celery's own calls on a user's app with durable jobs installed
(jobs/contrib/celery_control.py), on real PostgreSQL and RabbitMQ: ``app.AsyncResult``
gives a job's handle for a job's ID and Celery's own result for anything else, and
``app.control.revoke`` cancels a job durably (recorded in its history) and still broadcasts
the revoke to Celery's workers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.result import AsyncResult
from kombu import Connection, Exchange, Queue
from sqlalchemy import Engine

from jobs._config.settings import from_env
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs.application import JobsApp
from jobs.contrib.celery import install
from jobs.results import JobResult
from tests.conftest import AMQP_URL

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
def on_postgres(pg_url: str, clean_pg_engine: Engine, tmp_path: Path) -> Iterator[JobsApp]:
    registry = Registry(imports=())
    registry.register("ctl_check_order", lambda ctx, order_id: order_id)
    jobs_app = JobsApp(
        from_env({"JOBS_DATABASE_URL": pg_url, "JOBS_DATA_DIR": str(tmp_path)}),
        registry=registry,
    )
    yield jobs_app
    jobs_app.reset()


def user_app(jobs_app: JobsApp) -> Celery:
    app = Celery("proj", broker=AMQP_URL, set_as_current=False)
    app.conf.update(task_default_queue=f"ctl-{uuid.uuid4().hex}")
    install(app, jobs_app=jobs_app)
    jobs_app.use_doorbell(None)  # the jobs wait in the table; no worker is needed here
    return app


def broadcasts(conn: Connection, queue: Queue, job_id: str, timeout: float = 10.0) -> list[Any]:
    """The revoke broadcasts naming ``job_id`` that reached ``queue`` (bound to Celery's
    control exchange) within ``timeout`` seconds."""
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not found:
        message = queue(conn.default_channel).get(no_ack=True)
        if message is None:
            time.sleep(0.1)
            continue
        body = json.loads(message.body)
        if body.get("method") == "revoke" and job_id in json.dumps(body.get("arguments")):
            found.append(body)
    return found


def test_async_result_is_the_jobs_handle_for_a_job_and_celerys_for_anything_else(
    on_postgres: JobsApp,
) -> None:
    app = user_app(on_postgres)
    job_id = on_postgres.jobs.submit("ctl_check_order", {"order_id": 1})
    handle = app.AsyncResult(job_id)
    assert isinstance(handle, JobResult)
    assert handle.state == "PENDING"
    assert handle.job_state is State.QUEUED
    plain = app.AsyncResult(uuid.uuid4().hex)
    assert type(plain) is not JobResult
    assert isinstance(plain, AsyncResult)
    assert plain.app is app
    # Celery's internal calls (with the backend or task named) keep Celery's result.
    assert isinstance(app.AsyncResult(job_id, task_name="proj.add"), AsyncResult)


def test_revoke_cancels_the_job_durably_and_still_broadcasts(on_postgres: JobsApp) -> None:
    app = user_app(on_postgres)
    control = Queue(
        f"ctl-watch-{uuid.uuid4().hex}",
        Exchange(f"{app.conf.control_exchange}.pidbox", "fanout", durable=False),
        exclusive=True,
        auto_delete=True,
    )
    first = on_postgres.jobs.submit("ctl_check_order", {"order_id": 1})
    second = on_postgres.jobs.submit("ctl_check_order", {"order_id": 2})
    with Connection(AMQP_URL) as conn:
        control(conn.default_channel).declare()
        app.control.revoke(first)
        assert broadcasts(conn, control, first), "Celery's revoke was not broadcast"
        app.control.revoke([second, "not-a-job"], terminate=True)
        assert broadcasts(conn, control, second), "Celery's revoke was not broadcast"
    for job_id, said in ((first, ""), (second, " (terminate=True)")):
        job = on_postgres.jobs.get(job_id)
        assert job.state is State.CANCELLED
        last = on_postgres.jobs.history(job_id)[-1]
        assert last.to_state is State.CANCELLED
        assert last.reason is not None
        assert last.reason.startswith("revoked through Celery's app.control.revoke from ")
        assert last.reason.endswith(said)
    # A job already ended is left as it is, as Celery's revoke of a finished task.
    app.control.revoke(first)
    assert on_postgres.jobs.get(first).state is State.CANCELLED
    assert app.AsyncResult(first).state == "REVOKED"


def test_async_result_of_a_plain_task_works_with_the_job_table_unreachable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A jobs database that refuses connections never stops Celery's own results."""
    jobs_app = JobsApp(
        from_env(
            {
                "JOBS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
                "JOBS_DATA_DIR": str(tmp_path),
            }
        ),
        registry=Registry(imports=()),
    )
    app = Celery("proj", broker=AMQP_URL, set_as_current=False)
    install(app, jobs_app=jobs_app)
    task_id = uuid.uuid4().hex
    plain = app.AsyncResult(task_id)
    assert type(plain) is not JobResult
    assert plain.id == task_id
    assert "job table not read" in caplog.text
    jobs_app.reset()
