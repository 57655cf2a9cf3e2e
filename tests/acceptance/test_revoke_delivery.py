"""A plain Celery revoke broadcast naming a doorbell *delivery's* task ID (what Flower's
revoke button and ``celery control revoke <task-id>`` send) cancels the job durably, with
a real worker on PostgreSQL and RabbitMQ (jobs/_worker/revoked_deliveries.py)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def delivery_of(plain: Celery, job_id: str) -> str | None:
    """The task ID of the running delivery of ``job_id``, as Flower lists it (asked of the
    workers with Celery's ``inspect active``)."""
    answers: dict[str, list[dict[str, Any]]] = plain.control.inspect(timeout=3).active() or {}
    for requests in answers.values():
        for request in requests:
            if job_id in str(request.get("args")):
                return str(request["id"])
    return None


@pytest.mark.parametrize(
    ("pool", "terminate"), [("prefork", False), ("threads", False), ("prefork", True)]
)
@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_plain_revoke_of_a_running_delivery_cancels_its_job(
    stack: Stack, pool: str, terminate: bool
) -> None:
    worker = stack.worker("A", pool=pool, concurrency=2)
    running = stack.submit("sleep_steps", {"steps": 200, "seconds": 0.2})
    stack.wait_effect(running, "sleep-1")
    # Celery's own app, nothing of durable jobs installed on it: a broadcast as Flower's.
    plain = Celery("flower-like", broker=stack.env["JOBS_BROKER_URL"], set_as_current=False)
    task_id = wait_until(lambda: delivery_of(plain, running), 30, "the running delivery")
    assert task_id != running
    plain.control.revoke(task_id, terminate=terminate)

    job = stack.wait_state(running, (State.CANCELLED,), timeout=60)
    reason = stack.history(running)[-1].reason or ""
    assert reason.startswith("revoked through Celery's remote control"), reason
    assert task_id in reason
    assert len(stack.steps(running)) < 200
    assert job.state is State.CANCELLED
    if terminate:  # Celery ended the pool child running it, and says so
        wait_until(lambda: f"Terminating {task_id}" in worker.output(), 60, "terminated")
        assert len(stack.claims(running)) == 1  # never run again
    else:  # the delivery itself ends as Celery ends a revoked task (REVOKED in Flower)
        wait_until(
            lambda: "its delivery reported as revoked" in worker.output(), 60, "delivery revoked"
        )
    assert worker.alive()
