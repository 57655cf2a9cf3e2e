"""Workers never exit on a broker-side error (issue 10), on the shared RabbitMQ node with
this test's own queue: nothing on the node is stopped or reconfigured.

RabbitMQ refuses a declare whose arguments differ from the existing queue's
(``PRECONDITION_FAILED - inequivalent arg 'x-queue-type'``). Celery's default is to stop
the worker; ours logs one line per try, waits, and consumes as soon as the queue can be
declared (here: once an operator deleted the old classic queue).
"""

from __future__ import annotations

import time

import pytest
from kombu import Connection, Queue

from jobs._core.states import State
from jobs._doorbell.queues import task_queue
from jobs.application import default_app
from tests.acceptance.conftest import PG_RABBITMQ, Stack, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.rabbitmq]


def refusals(text: str) -> list[str]:
    return [line for line in text.splitlines() if "broker refused queue" in line]


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_inequivalent_queue_declare_waits_instead_of_exiting(stack: Stack) -> None:
    """A classic queue exists; workers configured for quorum wait (no exit, one line per
    try, a growing pause) and consume within seconds once the old queue is deleted."""
    url = stack.env["JOBS_BROKER_URL"]
    with Connection(url) as conn:  # an old deployment's classic queue (before priorities)
        Queue(stack.queue, exchange=stack.queue, routing_key=stack.queue, durable=True).bind(
            conn.default_channel
        ).declare()
    stack.configure(JOBS_QUEUE_TYPE="quorum")
    worker = stack.worker("A", wait=False)
    stack.sweeper()
    job_id = stack.submit("sleep_steps", {"steps": 2, "seconds": 0.1})
    wait_until(lambda: len(refusals(worker.output())) >= 4, 30, "four refused declares")
    time.sleep(3)
    lines = refusals(worker.output())
    assert worker.alive(), worker.output()[-3000:]
    assert all("PRECONDITION_FAILED - inequivalent arg 'x-queue-type'" in line for line in lines)
    assert "retrying in 0.5s (error 1 in a row)" in lines[0], lines[0]
    assert "retrying in 4.0s" in lines[-1], lines  # the pause grew, and stops growing
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
    assert "Connection to broker lost" not in worker.output()
    assert stack.job(job_id).state is State.QUEUED

    with Connection(url) as conn:  # the operator's fix: delete the old queue
        conn.default_channel.queue_delete(stack.queue)
    deleted = time.monotonic()
    job = stack.wait_state(job_id, timeout=30)
    resumed = time.monotonic() - deleted
    print(f"\n[inequivalent declare] {len(lines)} refusals; job done {resumed:.1f}s after the fix")
    assert job.state is State.COMPLETED, job
    assert resumed < 15, "consumption resumes within the longest pause plus a job"
    assert worker.alive()
    assert "consuming from" in worker.output()
    assert task_queue(default_app().settings).queue_arguments == {
        "x-queue-type": "quorum",
        "x-delivery-limit": 20,
    }
    with Connection(url) as conn:  # the queue the workers declared is the quorum one
        declared = conn.default_channel.queue_declare(stack.queue, passive=True)  # passive: exists
        assert declared.queue == stack.queue
