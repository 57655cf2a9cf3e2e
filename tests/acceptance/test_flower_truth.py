"""Flower tells the truth for outcomes no delivery decided, read from Flower's own HTTP API
(``/api/tasks``) with real workers, a sweeper, RabbitMQ and PostgreSQL:

- a job the sweeper fails (its only attempt crashed: the worker was SIGKILLed mid-step)
  shows as FAILURE with its error;
- a job cancelled while queued, and one cancelled while running, show as REVOKED (not
  SUCCESS ``dropped (...)`` or ``lease_lost``).

A job's tasks in Flower are its doorbells' deliveries (``jobs.<kind>`` with the job ID as
argument); what Flower says of the job is its newest task.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import pytest
import requests

import jobs
from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, free_port, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]

AUTH = ("oncall", "truth-pw")


def tasks_of(base: str, job_id: str) -> list[dict[str, Any]]:
    """Flower's tasks whose arguments name ``job_id``, oldest first."""
    answer = requests.get(f"{base}/api/tasks", auth=AUTH, timeout=10)
    answer.raise_for_status()
    tasks = [task for task in answer.json().values() if job_id in str(task.get("args"))]
    return sorted(tasks, key=lambda task: task.get("timestamp") or 0)


def newest_state(base: str, job_id: str, state: str) -> dict[str, Any] | None:
    """The job's newest task in Flower once it is in ``state`` (else ``None``)."""
    tasks = tasks_of(base, job_id)
    return tasks[-1] if tasks and tasks[-1].get("state") == state else None


def flower_up(base: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(f"{base}/healthcheck", timeout=2).ok
    return False


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_flower_shows_failure_for_the_sweepers_and_revoked_for_cancels(stack: Stack) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stack.start(
        "flower",
        ["flower", f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"],
    )
    wait_until(lambda: flower_up(base), 60, "Flower to start", interval=0.3)

    # Cancelled while queued: its doorbell waits in the queue until a worker starts.
    queued = stack.submit("sleep_steps", {"steps": 1, "seconds": 0.0})
    jobs.cancel(queued, "cancelled while queued")

    worker = stack.worker("A", pool="prefork", concurrency=1)
    revoked = wait_until(
        lambda: newest_state(base, queued, "REVOKED"), 90, f"{queued} REVOKED in Flower"
    )
    assert revoked["name"] == "jobs.sleep_steps"

    # Cancelled while running: the run is refused at its next step.
    running = stack.submit("sleep_steps", {"steps": 40, "seconds": 0.25})
    stack.wait_effect(running, "sleep-1")
    jobs.cancel(running, "cancelled while running")
    wait_until(lambda: newest_state(base, running, "REVOKED"), 90, f"{running} REVOKED")
    states = [task["state"] for task in tasks_of(base, running)]
    assert "SUCCESS" not in states, states

    # Failed by the sweeper: the only attempt's worker is killed mid-step.
    crashed = stack.submit("sleep_steps", {"steps": 40, "seconds": 0.25}, max_attempts=1)
    stack.wait_effect(crashed, "sleep-1")
    worker.kill(signal.SIGKILL)
    worker.kill_group()
    stack.sweeper()
    job = stack.wait_state(crashed, (State.FAILED,), timeout=90)
    assert job.last_error
    failed = wait_until(
        lambda: newest_state(base, crashed, "FAILURE"), 90, f"{crashed} FAILURE in Flower"
    )
    assert failed["name"] == "jobs.sleep_steps"
    assert job.last_error[:60] in str(failed.get("exception")), failed
    # A worker started later gets the crashed delivery's doorbell back (the same task):
    # it finds the job FAILED, and that task turns from STARTED to FAILURE too.
    stack.worker("B", pool="prefork", concurrency=1)

    def all_failed() -> list[dict[str, Any]] | None:
        tasks = tasks_of(base, crashed)
        return tasks if {task["state"] for task in tasks} == {"FAILURE"} else None

    assert len(wait_until(all_failed, 60, f"every task of {crashed} FAILURE")) >= 2
