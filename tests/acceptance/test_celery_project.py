"""Issue 14 end to end: ``examples/celery_project``, an existing-style Celery project with a
plain task, a beat schedule and two durable kinds on two queues, run as its team runs it:
``celery -A proj worker`` daemons on RabbitMQ (a virtual host of the test's own) and
PostgreSQL, a sweeper, and Flower. Checked from outside, through the job table, Celery's
remote control and Flower's own HTTP API:

- each kind runs only on the pool that consumes its queue;
- plain tasks run beside durable jobs on the mixed worker, and a plain task submits a
  durable job in its own database transaction;
- ``celery inspect registered`` lists the kinds;
- Flower names every delivery by its kind, shows a completed job as SUCCESS, a retried
  attempt as RETRY, a job that ended FAILED as FAILURE with its error, and a job parked for
  an approval as what it is;
- a job of a kind no worker knows stays QUEUED, and ``jobctl explain`` says why.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import Engine

from jobs._core.records import Job
from jobs._core.states import State
from jobs._store import JobStore
from jobs._store.db import make_engine
from tests.acceptance.conftest import (
    Proc,
    _create_database,
    _drop_database,
    free_port,
    rabbitmqctl,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "celery_project"
AUTH = ("ops", "flower-test")


class Project:
    """The example project's processes and the test's own view of its job table."""

    def __init__(
        self, env: dict[str, str], logs: Path, store: JobStore, folder: Path = PROJECT
    ) -> None:
        self.env = env
        self.logs = logs
        self.store = store
        self.folder = folder
        self.procs: list[Proc] = []

    def start(self, name: str, *args: str) -> Proc:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                args,
                cwd=self.folder,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log, node=f"{name}-")
        self.procs.append(proc)
        return proc

    def worker(self, name: str, queues: str) -> Proc:
        node = f"{name}-{uuid.uuid4().hex[:6]}"
        proc = self.start(
            name,
            *(sys.executable, "-m", "celery", "-A", "proj", "worker", "-Q", queues),
            *("-c", "2", "--hostname", f"{node}@%h", "-l", "INFO"),
        )
        proc.node = f"{node}@"
        return proc

    def run(self, code: str) -> str:
        """Python in the project's folder (as a web view or a shell of the project would)."""
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip()

    def job(self, job_id: str) -> Job:
        return self.store.reads.get(job_id)

    def wait_state(self, job_id: str, state: State, timeout: float = 60) -> Job:
        def reached() -> Job | None:
            job = self.job(job_id)
            return job if job.state is state else None

        return wait_until(reached, timeout, f"{job_id} to be {state.value}", interval=0.2)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.popen.wait(15)
            proc.kill_group()

    def dump_logs(self) -> None:
        for proc in self.procs:
            print(f"--- {proc.name}\n{proc.output()[-5000:]}")


@contextlib.contextmanager
def project_world(
    pg_admin: Engine, amqp_url: str, tmp_path: Path, folder: Path = PROJECT
) -> Iterator[Project]:
    """The project in ``folder`` on a RabbitMQ virtual host and a PostgreSQL database of its
    own, its processes stopped (and their logs printed if the test failed) at the end."""
    vhost = f"proj-{uuid.uuid4().hex[:8]}"
    rabbitmqctl("add_vhost", vhost)
    rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    database_url = _create_database(pg_admin)
    engine = make_engine(database_url)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("JOBS_", "CELERY_", "DJANGO_")) or key.startswith("JOBS_TEST_")
    }
    env.update(
        CELERY_BROKER_URL=f"{amqp_url.rstrip('/')}/{vhost}",
        JOBS_DATABASE_URL=database_url,
        JOBS_DATA_DIR=str(tmp_path / "jobs-data"),
        JOBS_SWEEP_INTERVAL_SECONDS="0.5",
        JOBS_RETRY_BACKOFF_SECONDS="0.5",
    )
    (tmp_path / "logs").mkdir()
    running = Project(env, tmp_path / "logs", JobStore(engine), folder)
    failed = True
    try:
        yield running
        failed = False
    finally:
        if failed:
            running.dump_logs()
        running.stop()
        engine.dispose()
        _drop_database(pg_admin, database_url)
        with contextlib.suppress(Exception):
            rabbitmqctl("delete_vhost", vhost)


@pytest.fixture
def project(pg_admin: Engine, amqp_url: str, tmp_path: Path) -> Iterator[Project]:
    with project_world(pg_admin, amqp_url, tmp_path) as running:
        # jobctl (sweeper, explain) on the project's own app
        running.env["JOBS_CELERY_APP"] = "proj"
        yield running


def flower_tasks(base: str) -> dict[str, dict[str, Any]]:
    answer = requests.get(f"{base}/api/tasks", auth=AUTH, timeout=5)
    answer.raise_for_status()
    tasks: dict[str, dict[str, Any]] = answer.json()
    return tasks


def deliveries_of(base: str, job_id: str) -> list[dict[str, Any]]:
    """Flower's tasks whose arguments name ``job_id``: the job's deliveries, found by a
    search on the job ID as an operator would."""
    return [task for task in flower_tasks(base).values() if job_id in str(task.get("args"))]


def test_an_existing_celery_project_runs_durable_jobs_routed_by_kind_and_flower_tells_the_truth(
    project: Project,
) -> None:
    small = project.worker("small", "celery,mail,jobs")
    big = project.worker("big", "video")
    port = free_port()
    flower = project.start(
        "flower",
        *(sys.executable, "-m", "celery", "-A", "proj", "flower"),
        *(f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"),
    )
    # jobctl flower: the same Flower on the project's app (JOBS_CELERY_APP), with the Jobs view.
    jobs_port = free_port()
    project.start(
        "jobctl-flower",
        *(sys.executable, "-m", "jobs", "flower", f"--port={jobs_port}", "--address=127.0.0.1"),
        f"--basic-auth={AUTH[0]}:{AUTH[1]}",
    )
    sweeper = project.start(
        "sweeper",
        sys.executable,
        "-c",
        "import proj.tasks; from jobs.cli import main; main()",
        "sweeper",
    )
    small.wait_ready()
    big.wait_ready()
    # Each worker says at start-up where it listens, the password masked.
    said = [line for line in small.output().splitlines() if "worker: broker" in line]
    assert said, small.output()[-3000:]
    assert "guest:***@" in said[0]
    assert "guest:guest" not in small.output()
    for queue in ("celery", "mail", "jobs"):
        assert queue in said[0].rpartition("queues ")[2]
    base = f"http://127.0.0.1:{port}"

    def flower_up() -> bool:
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{base}/healthcheck", timeout=2).ok
        return False

    wait_until(flower_up, 45, "Flower to answer", interval=0.3)
    assert sweeper.alive(), sweeper.output()
    assert flower.alive(), flower.output()

    # The kinds are tasks of the project's own app: celery inspect registered lists them.
    registered = project.run(
        "from proj.celery import app\n"
        "answer = app.control.inspect(timeout=3).registered() or {}\n"
        "print(sorted({name for names in answer.values() for name in names}))"
    )
    assert "'jobs.transcode'" in registered
    assert "'jobs.send_email'" in registered
    assert "'proj.tasks.add'" in registered

    ids = project.run(
        "import proj.tasks, jobs\n"
        "print(jobs.submit('transcode', {'video_id': 1}))\n"
        "print(jobs.submit('transcode', {'video_id': 2, 'fail': True}))\n"
        "print(jobs.submit('send_email', {'to': 'ops@example.com', 'needs_approval': True}))\n"
        "print(proj.tasks.place_order.delay(7, 'ada@example.com').id)\n"
        "print(proj.tasks.add.delay(2, 3).id)\n"
    ).split()
    encoded, broken, parked, order_task, add_task = ids

    done = project.wait_state(encoded, State.COMPLETED)
    assert big.owns(done.owner), done.owner  # the video pool ran the video kind
    assert done.queue == "video"
    mail = project.wait_state("order-7-mail", State.COMPLETED)
    assert small.owns(mail.owner), mail.owner  # the e-mail, from a plain task's transaction
    failed = project.wait_state(broken, State.FAILED)
    assert failed.attempts == 2
    waiting = project.wait_state(parked, State.WAITING_APPROVAL)
    assert waiting.queue == "mail"

    def shown() -> dict[str, Any] | None:
        by_state: dict[str, Any] = {}
        for job_id in (encoded, broken, parked):
            for task in deliveries_of(base, job_id):
                by_state.setdefault((job_id, task.get("state")), task)
        tasks = flower_tasks(base)
        plain = tasks.get(add_task, {}).get("state") == "SUCCESS"
        order = tasks.get(order_task, {}).get("state") == "SUCCESS"
        wanted = [
            (encoded, "SUCCESS"),
            (broken, "RETRY"),
            (broken, "FAILURE"),
            (parked, "SUCCESS"),
        ]
        if plain and order and all(key in by_state for key in wanted):
            return by_state
        return None

    seen = wait_until(shown, 60, "Flower to show every delivery's outcome", interval=0.5)
    assert seen[(encoded, "SUCCESS")]["name"] == "jobs.transcode"
    assert "completed" in str(seen[(encoded, "SUCCESS")]["result"])
    assert seen[(broken, "RETRY")]["name"] == "jobs.transcode"
    assert "codec not supported" in str(seen[(broken, "RETRY")]["exception"])
    assert seen[(broken, "FAILURE")]["name"] == "jobs.transcode"
    assert "FAILED" in str(seen[(broken, "FAILURE")]["exception"])
    assert "codec not supported" in str(seen[(broken, "FAILURE")]["exception"])
    assert seen[(parked, "SUCCESS")]["name"] == "jobs.send_email"
    assert "waiting_approval" in str(seen[(parked, "SUCCESS")]["result"])
    # Flower's task-type filter knows each kind by name.
    by_type = requests.get(
        f"{base}/api/tasks", params={"taskname": "jobs.transcode"}, auth=AUTH, timeout=5
    ).json()
    assert by_type
    assert {task["name"] for task in by_type.values()} == {"jobs.transcode"}

    # Approved in jobctl flower's Jobs view, the parked job resumes on the e-mail pool.
    jobs_base = f"http://127.0.0.1:{jobs_port}"

    def jobs_flower_up() -> bool:
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{jobs_base}/healthcheck", timeout=2).ok
        return False

    wait_until(jobs_flower_up, 45, "jobctl flower to answer", interval=0.3)
    session = requests.Session()
    session.auth = AUTH
    overview = session.get(f"{jobs_base}/jobs", timeout=10)
    assert overview.status_code == 200
    assert "transcode" in overview.text
    assert "send_email" in overview.text
    page = session.get(f"{jobs_base}/jobs/job/{parked}", timeout=10)
    assert "WAITING_APPROVAL" in page.text
    token = re.search(r'name="_xsrf" value="([^"]+)"', page.text)
    assert token is not None, page.text
    approved = session.post(
        f"{jobs_base}/jobs/job/{parked}",
        data={"_xsrf": token.group(1), "action": "approve"},
        timeout=10,
    )
    assert approved.status_code == 200, approved.text
    assert "Approved" in approved.text
    resumed = project.wait_state(parked, State.COMPLETED)
    assert small.owns(resumed.owner), resumed.owner
    assert [
        move.approved_by for move in project.store.reads.history(parked) if move.approved_by
    ] == [f"{AUTH[0]} (Flower)"]

    # A kind no worker knows is never failed: it stays QUEUED, and explain says why.
    orphan = project.run(
        "import proj.tasks, jobs\njobs.job('orphan')(lambda ctx: 1)\nprint(jobs.submit('orphan'))\n"
    )
    wait_until(
        lambda: "does not know kind 'orphan'" in small.output(),
        30,
        "the mixed worker to leave the orphan for a worker that knows it",
        interval=0.2,
    )
    still = project.job(orphan)
    assert (still.state, still.attempts) == (State.QUEUED, 0)
    explained = subprocess.run(
        [sys.executable, "-m", "jobs", "explain", orphan],
        cwd=PROJECT,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "do not know kind 'orphan'" in explained, explained
    assert small.alive()
    assert big.alive()
