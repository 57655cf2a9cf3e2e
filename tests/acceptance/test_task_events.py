"""Celery's task events from a real worker (what Flower's task list, charts and states are
made of): every delivery's received, started and succeeded events reach the ``celeryev``
exchange, and a drain's events travel many to a message (the worker's consumer flushes its
event buffer once per ``EVENT_FLUSH_SECONDS`` instead of at every turn of its loop, which
cost the main process a publish per event)."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack

pytestmark = pytest.mark.acceptance

JOBS = 60


def of_jobs(messages: list[list[Any]], job_ids: list[str]) -> list[list[Any]]:
    """The events of ``messages`` about the deliveries of ``job_ids``: other tests' workers
    share the broker, and with it Celery's ``celeryev`` exchange. A delivery is known by its
    task ID, which its ``task-received`` event pairs with the job ID in its arguments."""
    ours = {
        event["uuid"]
        for batch in messages
        for event in batch
        if event.get("type") == "task-received"
        and any(job_id in str(event.get("args", "")) for job_id in job_ids)
    }
    kept = [[event for event in batch if event.get("uuid") in ours] for batch in messages]
    return [batch for batch in kept if batch]


def read_events(conn: Connection, queue: Queue, quiet_seconds: float = 2.0) -> list[list[Any]]:
    """Every event message in ``queue`` until none came for ``quiet_seconds``, each as the
    list of events it carries (a buffer's ``task.multi`` message, or one event)."""
    messages: list[list[Any]] = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_seconds:
        message = queue(conn.default_channel).get(no_ack=True)
        if message is None:
            time.sleep(0.1)
            continue
        quiet_since = time.monotonic()
        body = json.loads(message.body)
        messages.append(body if isinstance(body, list) else [body])
    return messages


@pytest.fixture
def events(stack: Stack) -> Iterator[tuple[Connection, Queue]]:
    """A connection to the stack's broker and a queue of its own bound to Celery's
    ``celeryev`` exchange for task events, declared before any worker starts."""
    queue = Queue(
        f"events-{uuid.uuid4().hex}",
        Exchange("celeryev", "topic", durable=True),
        routing_key="task.#",
        exclusive=True,
    )
    with Connection(stack.env["JOBS_BROKER_URL"]) as conn:
        queue(conn.default_channel).declare()
        yield conn, queue


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_every_task_event_reaches_flower_and_a_drain_batches_them(
    stack: Stack, events: tuple[Connection, Queue]
) -> None:
    conn, queue = events
    worker = stack.worker("A", pool="prefork", concurrency=2, wait=False)
    worker.wait_ready()
    ids = [stack.submit("check_order", {"order_id": n, "check_seconds": 0.0}) for n in range(JOBS)]
    for job_id in ids:
        assert stack.wait_state(job_id, timeout=60).state is State.COMPLETED
    messages = of_jobs(read_events(conn, queue), ids)
    seen = Counter(event["type"] for batch in messages for event in batch)
    # Every delivery's events arrived: Flower shows each job's task as it went.
    for kind in ("task-received", "task-started", "task-succeeded"):
        assert seen[kind] >= JOBS, seen
    sent = sum(len(batch) for batch in messages)
    print(f"\n[events] {sent} task events in {len(messages)} messages")
    assert len(messages) < sent / 2, (len(messages), sent)


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_warm_shutdown_sends_the_events_still_buffered(
    stack: Stack, events: tuple[Connection, Queue]
) -> None:
    conn, queue = events
    worker = stack.worker("A", pool="prefork", concurrency=1, wait=False)
    worker.wait_ready()
    job_id = stack.submit("check_order", {"order_id": 1, "check_seconds": 0.0})
    assert stack.wait_state(job_id, timeout=60).state is State.COMPLETED
    worker.kill(signal.SIGTERM)  # within the flush window of the job's last events
    worker.popen.wait(30)
    messages = of_jobs(read_events(conn, queue), [job_id])
    seen = Counter(event["type"] for batch in messages for event in batch)
    assert seen["task-succeeded"] == 1, seen
