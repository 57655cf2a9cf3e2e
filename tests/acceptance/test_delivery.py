"""What the queue does not give you: duplicates, lost messages, garbage (scenarios 5-7).

The broker is a doorbell. A second ring for the same job meets a failed claim and is
acknowledged and dropped; a ring that never sounded is rung again by the sweeper; a
ring that is not a job ID at all is logged once and acknowledged, never retried.
"""

from __future__ import annotations

import json
import pickle
import re
import time
import uuid

import pytest

from jobs import api
from jobs.core.settings import reset_settings
from jobs.core.states import State
from jobs.runtime import process
from tests.acceptance.conftest import (
    BOTH,
    PG_RABBITMQ,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)

pytestmark = pytest.mark.acceptance


def dropped_lines(stack: Stack, job_id: str) -> list[str]:
    return [
        line
        for proc in stack.procs
        for line in proc.output().splitlines()
        if f"job {job_id}: delivery dropped" in line
    ]


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_duplicate_deliveries_are_acked_and_dropped(stack: Stack) -> None:
    """Scenario 5: the same job ID published twice while the job runs and twice after it
    completed; two workers, so the duplicates arrive while the owner is busy."""
    workers = [stack.worker("A", wait=False), stack.worker("B", wait=False)]
    for worker in workers:
        worker.wait_ready()
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 3.0})
    stack.wait_effect(job_id, "check_payment:start", timeout=30)
    owner = next(w for w in workers if w.owns(stack.job(job_id).owner))
    process.current().dispatch([job_id])
    process.current().dispatch([job_id])
    lines = wait_until(
        lambda: len(dropped_lines(stack, job_id)) >= 2 and dropped_lines(stack, job_id),
        20,
        "two deliveries dropped while the job runs",
    )
    assert all("RUNNING under" in line for line in lines), lines
    assert stack.job(job_id).state is State.RUNNING  # the duplicates did not disturb it

    job = stack.wait_state(job_id, timeout=30)
    assert job.state is State.COMPLETED, job
    process.current().dispatch([job_id])
    process.current().dispatch([job_id])
    wait_until(
        lambda: len(dropped_lines(stack, job_id)) >= 4,
        20,
        "two deliveries dropped after completion",
    )
    stack.wait_queue_empty()
    lines = dropped_lines(stack, job_id)
    assert len(lines) == 4, lines  # one line per extra delivery, nothing retried
    assert sum("already COMPLETED" in line for line in lines) == 2, lines

    # One claim, one run of each step, nothing written by the duplicates.
    assert [t.to_state for t in stack.history(job_id)] == [
        State.QUEUED,
        State.RUNNING,
        State.COMPLETED,
    ]
    assert owner.owns(stack.job(job_id).owner)
    assert stack.effect_count(job_id, "lookup_order") == 1
    assert stack.effect_count(job_id, "check_payment:start") == 1
    assert assert_recorded_steps_ran_once(stack, job_id) == {"lookup_order": 1, "check_payment": 1}
    assert stack.job(job_id).fence == 1


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_lost_message_is_redispatched_by_sweeper(stack: Stack) -> None:
    """Scenario 6a: no message was ever sent (the doorbell is off in this process); the
    job is QUEUED and looks dispatched, so only the sweeper's lost-message rule
    (``JOBS_REDISPATCH_AFTER_SECONDS``) can get it to a worker."""
    stack.configure(JOBS_REDISPATCH_AFTER_SECONDS=2)
    worker = stack.worker("A", wait=False)
    stack.sweeper()
    worker.wait_ready()
    api.set_dispatcher(None)
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.2})
    submitted = stack.job(job_id)
    assert submitted.state is State.QUEUED
    assert submitted.dispatched_at is not None
    assert stack.queue_depth() == (0, 0)  # no message exists

    job = stack.wait_state(job_id, timeout=30)
    assert job.state is State.COMPLETED, job
    claim = stack.claims(job_id)[0]
    waited = (claim.at - submitted.created_at).total_seconds()
    print(
        f"\n[{stack.backend}] lost message: claimed {waited:.2f}s after submit "
        "(re-dispatch after 2s)"
    )
    assert waited >= 2 - 0.1, waited  # not before the message counted as lost
    sweeper = next(p for p in stack.procs if p.name == "sweeper").output()
    assert re.search(rf"dispatched=\('{job_id}',\)", sweeper), sweeper[-2000:]
    assert_recorded_steps_ran_once(stack, job_id)
    assert len(stack.claims(job_id)) == 1
    stack.wait_queue_empty()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_failed_publish_loses_nothing(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario 6b: the submitting process cannot reach the broker (a closed port); the
    job is committed QUEUED and marked not-dispatched, and the sweeper sends it."""
    worker = stack.worker("A")
    monkeypatch.setenv("JOBS_BROKER_URL", "amqp://guest:guest@127.0.0.1:1//")
    reset_settings()
    api.reset()
    started = time.monotonic()
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.2})
    print(f"\n[failed publish] submit returned after {time.monotonic() - started:.2f}s")
    job = stack.job(job_id)
    assert job.state is State.QUEUED, job
    assert job.dispatched_at is None, job
    assert stack.queue_depth() == (0, 0)  # there is no message a worker could get
    assert stack.job(job_id).state is State.QUEUED

    stack.sweeper()  # with the stack's (working) broker URL
    job = stack.wait_state(job_id, timeout=30)
    assert job.state is State.COMPLETED, job
    assert worker.owns(job.owner)
    assert_recorded_steps_ran_once(stack, job_id)
    stack.wait_queue_empty()


LOGGED = re.compile(r"^\[[^]]+: (WARNING|ERROR|CRITICAL)/")
ERROR_LINE = re.compile(r"^\[[^]]+: (?:ERROR|CRITICAL)/", re.MULTILINE)
RECEIVED = re.compile(r"Task jobs\.run\[([0-9a-f-]+)\] received")


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_garbage_messages_are_logged_once_and_dropped(stack: Stack) -> None:
    """Scenario 7: messages that are not a job ID: wrong arguments, a pickle, a body that
    is not JSON. The worker logs one error for each, acknowledges it, keeps running."""
    from kombu import Connection, Exchange, Producer  # noqa: PLC0415

    from jobs.core.settings import get_settings  # noqa: PLC0415
    from jobs.runtime.celery_app import TASK_NAME, app_for  # noqa: PLC0415

    worker = stack.worker("A")
    app = app_for(get_settings())
    task_messages = [
        ((), {}),  # no job id
        ((123,), {}),  # not a string
        (("x" * 5000,), {}),  # far too long for an id
        (("job-1",), {"junk": True}),  # extra kwargs
        ((["job-1"],), {}),  # a list, not an id
    ]
    for args, kwargs in task_messages:
        app.send_task(TASK_NAME, args=args, kwargs=kwargs, queue=stack.queue)
    # A task name the worker does not have.
    app.send_task("jobs.nope", args=("job-1",), queue=stack.queue)

    headers = {
        "task": TASK_NAME,
        "id": str(uuid.uuid4()),
        "lang": "py",
        "argsrepr": "",
        "kwargsrepr": "",
    }
    raw: list[tuple[bytes, str, str, dict[str, str] | None]] = [
        # pickle, as a protocol-1 body: refused before it is unpickled
        (
            pickle.dumps({"task": TASK_NAME, "id": "p1", "args": ["x"], "kwargs": {}}),
            "application/x-python-serialize",
            "binary",
            None,
        ),
        # pickle with protocol-2 headers
        (
            pickle.dumps((["x"], {}, {})),
            "application/x-python-serialize",
            "binary",
            dict(headers, id=str(uuid.uuid4())),
        ),
        # not JSON at all, with and without task headers
        (b"\x00\xffnot json{", "application/json", "utf-8", None),
        (b"{not json", "application/json", "utf-8", dict(headers, id=str(uuid.uuid4()))),
        # JSON, but not a Celery message
        (json.dumps({"hello": "world"}).encode(), "application/json", "utf-8", None),
    ]
    with Connection(stack.env["JOBS_BROKER_URL"]) as conn:
        producer = Producer(conn.default_channel, exchange=Exchange(stack.queue, "direct"))
        for body, content_type, encoding, hdrs in raw:
            producer.publish(
                body,
                routing_key=stack.queue,
                content_type=content_type,
                content_encoding=encoding,
                headers=hdrs or {},
            )
    garbage = len(task_messages) + 1 + len(raw)

    stack.wait_queue_empty(timeout=30)
    # The worker survived all of it and still runs a real job.
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.1})
    assert stack.wait_state(job_id, timeout=30).state is State.COMPLETED
    assert worker.alive()
    stack.wait_queue_empty(timeout=30)

    log = worker.output()
    print(f"\n[garbage] {garbage} garbage messages; the worker logged:")
    for line in log.splitlines():
        if LOGGED.match(line) and "No hostname was supplied" not in line:
            print("   ", line[:150])
    # One line per garbage message: ours for wrong arguments, Celery's for the rest.
    expected = {
        "ERROR/MainProcess] dropped a garbage message": len(task_messages),
        "ERROR/MainProcess] Received unregistered task of type 'jobs.nope'": 1,
        "CRITICAL/MainProcess] Can't decode message body: ContentDisallowed": 1,
        "ERROR/MainProcess] Received invalid task message: Refusing to deserialize "
        "untrusted content of type pickle": 1,
        "CRITICAL/MainProcess] Can't decode message body: DecodeError": 2,
        "WARNING/MainProcess] Received and deleted unknown message": 1,
    }
    for text, count in expected.items():
        assert log.count(text) == count, (text, log[-8000:])
    assert sum(expected.values()) == garbage
    assert len(ERROR_LINE.findall(log)) == garbage - 1, log[-8000:]  # + the one warning
    # Nothing was redelivered: each delivery was seen once (acked or rejected for good).
    received = RECEIVED.findall(log)
    assert len(received) == len(set(received)) == len(task_messages) + 1, received
