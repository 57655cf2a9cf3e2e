"""A pytest plugin for the installed pass of Celery's suite: durable jobs installed on the
suite's Celery apps, and running in its worker beside its tests.

- ``jobs.contrib.celery.install(app)`` on the suite's session app (the one its in-process
  worker runs) and on each test's app (the one its tests send through), as a project
  installs durable jobs on its one app. The session app's jobs application has a kind of
  its own (:data:`KIND`) on a PostgreSQL database made for the run
  (``JOBS_TEST_POSTGRES_URL``'s server) and dropped at its end; doorbells go through the
  suite's broker (``TEST_BROKER``).
- Durable jobs share the suite's one queue, ``celery`` (``JOBS_QUEUE=celery``: the suite's
  guard fails any test whose app lists another queue); ``CELERY_SUITE_JOBS_QUEUE`` names a
  queue of their own instead.
- Before the session worker starts, its app is prepared as ``celery -A proj worker -Q
  celery,<JOBS_QUEUE>`` (the README's command for an installed app) prepares it:
  ``celeryd_init``, then the ``-Q`` selection, so the worker consumes the jobs queue too.
- After each test that used the session worker (the suite's own teardown, which waits
  for the worker to be idle, has run), one job of :data:`KIND` is submitted and must be
  COMPLETED, with both its steps recorded, within :data:`JOB_WAIT_SECONDS`: else the
  test's teardown fails and says why. So durable jobs run in the suite's worker between
  its tests for the whole run, and a worker that stopped running them shows as a
  difference from the plain pass.

The count of jobs submitted and completed is written to ``CELERY_SUITE_OUTCOMES`` at the
end (``{"beside": {...}}``). Nothing here changes what the suite's tests do.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import signals
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

import jobs
from jobs._config.settings import from_env, normalize_database_url
from jobs._core.registry import Registry
from jobs._core.states import State
from jobs._doorbell.queues import queue_names
from jobs._store.db import make_engine
from jobs._store.schema import upgrade
from jobs.application import JobsApp
from jobs.contrib.celery import install
from tests.celery_suite.outcomes import OUTCOMES_ENV, QUEUE_TYPE_ENV

KIND = "celery_suite_beside"
JOB_WAIT_SECONDS = 30.0
"""How long a job beside the suite may take to complete (a loaded machine: it takes well
under a second)."""
STALLED_WAIT_SECONDS = 3.0
"""After one job did not complete in time, how long the next ones are waited for, so a
worker that stopped running jobs costs the run seconds per test, not half a minute."""
SHARED_QUEUE = "celery"
"""The suite's one queue (``task_default_queue``), which durable jobs share in the run."""
JOBS_QUEUE_ENV = "CELERY_SUITE_JOBS_QUEUE"
"""Set to another name to run the installed pass with durable jobs on a queue of their own."""
FINISHED = (State.COMPLETED, State.FAILED, State.CANCELLED)


def add_one(n: int) -> int:
    return n + 1


def double(n: int) -> int:
    return 2 * n


def beside(ctx: jobs.JobContext, n: int) -> dict[str, int]:
    """The job run beside the suite's tests: two recorded steps."""
    plus_one = ctx.step("add_one", add_one, n)
    return {"n": n, "result": ctx.step("double", double, plus_one)}


class Beside:
    """The run's durable jobs: their database, their jobs application and what ran."""

    def __init__(self) -> None:
        admin_url = normalize_database_url(
            os.environ.get("JOBS_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
        )
        name = f"celery_suite_{uuid.uuid4().hex[:10]}"
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        # The settings first: a bad TEST_BROKER stops the run before a database is made.
        self.settings = from_env(
            {
                "JOBS_DATABASE_URL": url,
                "JOBS_BROKER_URL": os.environ.get("TEST_BROKER", "pyamqp://"),
                "JOBS_DATA_DIR": tempfile.mkdtemp(prefix="celery-suite-jobs-"),
                "JOBS_QUEUE_TYPE": os.environ.get(QUEUE_TYPE_ENV, "classic"),
                # The suite's rule (its autouse guard): tests use only the shared queue
                # ``celery``. So durable jobs share it, as install(app) adopts an app's
                # own queue of JOBS_QUEUE's name.
                "JOBS_QUEUE": os.environ.get(JOBS_QUEUE_ENV, SHARED_QUEUE),
            }
        )
        self.admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        self.database = name
        engine = make_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        self.registry = Registry(imports=())
        self.registry.register(KIND, beside, max_attempts=3)
        self.app = JobsApp(self.settings, registry=self.registry)
        self.session_app: Any = None
        self.worker_up = False
        self.submitted = 0
        self.completed = 0
        self.not_completed: list[str] = []
        self.stalled = False

    def install_on_session_app(self, celery: Any) -> None:
        install(celery, jobs_app=self.app)
        self.session_app = celery

    def install_on_test_app(self, celery: Any) -> None:
        """A test's own app: installed as the session's is, with a jobs application of its
        own (the same settings and kinds), so the doorbells of the jobs beside keep going
        through the session app, which outlives the test's."""
        install(celery, jobs_app=JobsApp(self.settings, registry=self.registry))

    def before_the_worker(self) -> None:
        """What ``celery -A proj worker -Q celery,<JOBS_QUEUE>`` (the README's command) does before
        its consumer starts: ``celeryd_init``, then the ``-Q`` selection
        (``WorkController.setup_queues``; the suite's worker is given no queues, so it
        keeps this one)."""
        celery = self.session_app
        queues = list(dict.fromkeys([celery.conf.task_default_queue, *queue_names(self.settings)]))
        signals.celeryd_init.send(
            sender=None,
            instance=SimpleNamespace(app=celery),
            conf=celery.conf,
            options={"queues": ",".join(queues)},
        )
        celery.amqp.queues.select(queues)

    def run_one(self, test: str) -> None:
        """Submit one job and wait until it completed; fail the caller (the test's
        teardown) when it did not."""
        n = self.submitted
        job_id = self.app.jobs.submit(KIND, {"n": n})
        self.submitted += 1
        wait = STALLED_WAIT_SECONDS if self.stalled else JOB_WAIT_SECONDS
        deadline = time.monotonic() + wait
        job = self.app.jobs.get(job_id)
        while job.state not in FINISHED and time.monotonic() < deadline:
            time.sleep(0.05)
            job = self.app.jobs.get(job_id)
        steps = [step.name for step in self.app.jobs.steps(job_id)]
        if job.state is State.COMPLETED and job.result == {"n": n, "result": 2 * (n + 1)}:
            self.completed += 1
            self.stalled = False
            return
        self.stalled = True
        self.not_completed.append(test)
        raise AssertionError(
            f"durable job {job_id} beside the suite is {job.state.value} after {wait:.0f}s "
            f"(steps {steps}, attempts {job.attempts}, error {job.last_error!r})"
        )

    def close(self) -> None:
        path = os.environ.get(OUTCOMES_ENV)
        if path:
            summary = {
                "submitted": self.submitted,
                "completed": self.completed,
                "not_completed": self.not_completed,
            }
            with open(path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"beside": summary}) + "\n")
        self.app.reset()
        with contextlib.suppress(Exception), self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'))
        self.admin.dispose()


BESIDE: Beside | None = None


def pytest_configure(config: pytest.Config) -> None:
    global BESIDE  # noqa: PLW0603 - one per run of the suite
    BESIDE = Beside()


def pytest_unconfigure(config: pytest.Config) -> None:
    global BESIDE  # noqa: PLW0603
    if BESIDE is not None:
        BESIDE.close()
        BESIDE = None


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Any:
    assert BESIDE is not None
    if fixturedef.argname == "celery_session_worker" and BESIDE.session_app is not None:
        BESIDE.before_the_worker()
    value = yield
    if fixturedef.argname == "celery_session_app":
        BESIDE.install_on_session_app(value)
    elif fixturedef.argname == "celery_app":
        BESIDE.install_on_test_app(value)
    elif fixturedef.argname == "celery_session_worker":
        BESIDE.worker_up = True
    return value


@pytest.fixture(autouse=True)
def durable_job_beside(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the session worker: one durable job through that worker."""
    yield
    if BESIDE is not None and BESIDE.worker_up and "celery_session_worker" in request.fixturenames:
        BESIDE.run_one(request.node.nodeid)
