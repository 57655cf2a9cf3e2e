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
from typing import Any

import pytest

import jobs
from jobs._core.records import Batch
from jobs._core.states import State
from jobs.application import default_app
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
    default_app().runtime.ring_batch(Batch((job_id,)))
    default_app().runtime.ring_batch(Batch((job_id,)))
    lines = wait_until(
        lambda: len(dropped_lines(stack, job_id)) >= 2 and dropped_lines(stack, job_id),
        20,
        "two deliveries dropped while the job runs",
    )
    assert all("RUNNING under" in line for line in lines), lines
    assert stack.job(job_id).state is State.RUNNING  # the duplicates did not disturb it

    job = stack.wait_state(job_id, timeout=30)
    assert job.state is State.COMPLETED, job
    default_app().runtime.ring_batch(Batch((job_id,)))
    default_app().runtime.ring_batch(Batch((job_id,)))
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
def test_lost_message_is_rung_again_by_sweeper(stack: Stack) -> None:
    """Scenario 6a: no message was ever sent (the doorbell is off in this process); the
    job is QUEUED and looks dispatched, so only the sweeper's lost-message rule
    (``JOBS_RING_AGAIN_AFTER_SECONDS``) can get it to a worker."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=2)
    worker = stack.worker("A", wait=False)
    stack.sweeper()
    worker.wait_ready()
    jobs.set_doorbell(None)
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
        "(rung again after 2s)"
    )
    assert waited >= 2 - 0.1, waited  # not before the message counted as lost
    sweeper = next(p for p in stack.procs if p.name == "sweeper").output()
    assert re.search(rf"rung=\('{job_id}',\)", sweeper), sweeper[-2000:]
    assert_recorded_steps_ran_once(stack, job_id)
    assert len(stack.claims(job_id)) == 1
    stack.wait_queue_empty()


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_failed_publish_loses_nothing(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario 6b: the submitting process cannot reach the broker (a closed port); the
    job is committed QUEUED and marked not-dispatched, and the sweeper sends it."""
    worker = stack.worker("A")
    monkeypatch.setenv("JOBS_BROKER_URL", "amqp://guest:guest@127.0.0.1:1//")
    default_app().reset_settings()
    jobs.reset()
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
RECEIVED = re.compile(r"Task jobs\.[\w.:-]+\[([0-9a-f-]+)\] received")


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_garbage_messages_are_logged_once_and_dropped(stack: Stack) -> None:
    """Scenario 7: messages that are not a job ID: wrong arguments, a pickle, a body that
    is not JSON. The worker logs one line for each, acknowledges it, keeps running."""
    from kombu import Connection, Exchange, Producer  # noqa: PLC0415

    from jobs._doorbell.queues import TASK_NAME  # noqa: PLC0415
    from jobs.application import default_app  # noqa: PLC0415

    worker = stack.worker("A")
    app = default_app().celery
    task_messages = [
        ((), {}),  # no job id
        ((123,), {}),  # not a string
        (("x" * 5000,), {}),  # far too long for an id
        (("job-1",), {"junk": True}),  # extra kwargs
        ((["job-1"],), {}),  # a list, not an id
    ]
    for args, kwargs in task_messages:
        app.send_task(TASK_NAME, args=args, kwargs=kwargs, queue=stack.queue)
    # A task name that is not a doorbell's.
    app.send_task("billing.nope", args=("job-1",), queue=stack.queue)
    # A doorbell of a kind this worker does not know: left for a worker that does, with a
    # warning of its own (not counted as garbage).
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
    # One line per garbage message, all from the doorbell gate: none reached Celery's
    # request code (its unpickling refusal, its decode errors with tracebacks).
    assert log.count(f"ERROR/MainProcess] {DROPPED}") == garbage, log[-8000:]
    assert len(ERROR_LINE.findall(log)) == garbage, log[-8000:]
    assert "Traceback" not in log, log[-8000:]
    assert "job job-1: this worker does not know kind 'nope'" in log, log[-8000:]
    # Only the real job's delivery was received; nothing was redelivered.
    received = RECEIVED.findall(log)
    assert len(received) == 1, received


DROPPED = "dropped a message that is not a job doorbell"
DROPPED_FILE = re.compile(r"dropped (an unreadable|a) message file")


def write_raw_files(stack: Stack) -> int:
    """On the filesystem transport anyone who can write to the broker folder publishes:
    message files that are not message envelopes at all (kombu's own transport stops
    the worker on each of them: kombu issue #1551)."""
    folder = stack.data_dir / "broker"
    envelope = {"body": "!!not base64!!", "properties": {"body_encoding": "base64"}}
    contents = [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[" * 5000,
        b"{}",
        b"[1, 2]",
        json.dumps({"properties": {}}).encode(),
        json.dumps(envelope).encode(),
    ]
    for number, content in enumerate(contents):
        (folder / f"{number}_{uuid.uuid4()}.{stack.queue}.msg").write_bytes(content)
    return len(contents)


def publish_raw(stack: Stack, messages: list[tuple[bytes, str, str, dict[str, Any]]]) -> None:
    """Publish hand-made messages to the stack's queue on either transport, through the
    app's own connection settings (the filesystem transport needs its folders)."""
    from jobs.application import default_app  # noqa: PLC0415

    app = default_app().celery
    queue = app.amqp.queues[stack.queue]
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        for body, content_type, encoding, headers in messages:
            producer.publish(
                body,
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                declare=[queue],
                content_type=content_type,
                content_encoding=encoding,
                headers=headers,
            )


def hostile_messages() -> list[tuple[bytes, str, str, dict[str, Any]]]:
    """Messages anyone could publish to our queue, each of which a worker must drop."""

    def run(**extra: Any) -> dict[str, Any]:
        return {"task": "jobs.run", "id": str(uuid.uuid4()), "lang": "py", **extra}

    def as_json(value: Any) -> bytes:
        return json.dumps(value).encode()

    empty = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    doorbell = as_json([["job-1"], {}, empty])
    j, utf8 = "application/json", "utf-8"
    return [
        (as_json({"a": 1}), j, utf8, run()),  # stopped every worker on the landed main
        (as_json([1, 2]), j, utf8, run()),
        (as_json("job-1"), j, utf8, run()),
        (as_json(None), j, utf8, run()),
        (as_json(7), j, utf8, run()),
        (as_json([[], {}, empty]), j, utf8, run()),
        (as_json([["job-1"], [], empty]), j, utf8, run()),
        (as_json([["job-1", "job-2"], {}, empty]), j, utf8, run()),
        (as_json([["job-1"], {}, {"chord": {"task": "x"}}]), j, utf8, run()),
        (as_json([[{"id": "job-1"}], {}, empty]), j, utf8, run()),
        (as_json([["job 1\n"], {}, empty]), j, utf8, run()),
        (b"[" * 3000 + b"]" * 3000, j, utf8, run()),  # deeper than json.loads recurses
        (as_json([["x" * 2_000_000], {}, empty]), j, utf8, run()),  # 2 MB
        (b"\xff\xfe[[", j, utf8, run()),
        (b'[["job-1"], {}, {}]', "text/plain", utf8, run()),
        (doorbell, j, "latin-1", run()),
        (doorbell, j, utf8, {"task": ["jobs.run"], "id": "x"}),  # an unhashable task name
        (doorbell, j, utf8, {"task": "jobs.run"}),  # no task id
        (doorbell, j, utf8, run(id={"nested": 1})),
        (doorbell, j, utf8, run(eta="2999-01-01T00:00:00+00:00")),  # would be held forever
        (doorbell, j, utf8, run(eta="not a date")),
        (doorbell, j, utf8, run(expires=12)),
        (doorbell, j, utf8, run(timelimit=[0.001, 0.001])),
        (doorbell, j, utf8, {"task": "nope"}),  # another task, no id
        (doorbell, j, utf8, {"task": 12, "id": "x"}),
        (as_json({"task": "jobs.run", "id": "p1", "args": {"a": 1}}), j, utf8, {}),  # proto 1
    ]


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_hostile_messages_never_stop_a_worker(stack: Stack) -> None:
    """Issue 8: whatever its headers, body, content type or size, a message on our queue
    is acknowledged and dropped with one bounded line; the worker (main process and pool
    child) stays up and runs the next real job. On the landed main the first message alone
    stopped the worker ("Unrecoverable error: ValueError") and every restarted one."""
    worker = stack.worker("A", pool="prefork", concurrency=1)
    children = worker.pool_children()
    messages = hostile_messages()
    # A well-formed doorbell with a huge header: handled (an unknown job), but the header
    # is rebuilt, so the sender's text reaches no log line.
    noisy = {"task": "jobs.run", "id": str(uuid.uuid4()), "argsrepr": "A" * 100_000}
    empty = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    doorbell = json.dumps([["no-such-job"], {}, empty]).encode()
    publish_raw(stack, [*messages, (doorbell, "application/json", "utf-8", noisy)])
    files = write_raw_files(stack) if not stack.rabbitmq else 0

    wait_until(
        lambda: (
            (
                worker.output().count(DROPPED) >= len(messages)
                and len(DROPPED_FILE.findall(worker.output())) >= files
            )
            or not worker.alive()
        ),
        60,
        "every hostile message dropped",
    )
    assert worker.alive(), worker.output()[-6000:]
    stack.wait_queue_empty(timeout=30)
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.1})
    assert stack.wait_state(job_id, timeout=30).state is State.COMPLETED
    assert worker.alive()
    assert worker.pool_children() == children  # no pool child died either
    stack.wait_queue_empty(timeout=30)

    log = worker.output()
    dropped = [line for line in log.splitlines() if DROPPED in line]
    print(f"\n[{stack.backend}] {len(messages)} hostile messages; e.g.:")
    for line in dropped[:4]:
        print("   ", line)
    assert len(dropped) == len(messages), dropped
    assert len(DROPPED_FILE.findall(log)) == files, log[-6000:]
    assert all(len(line) < 400 for line in dropped), max(dropped, key=len)
    assert "Unrecoverable error" not in log
    assert "Traceback" not in log, log[-6000:]
    assert "job no-such-job: delivery dropped, unknown job" in log
    assert "A" * 1000 not in log  # the sender's argsrepr never reached a log line
