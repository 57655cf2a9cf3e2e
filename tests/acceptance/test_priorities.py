"""Priorities with real workers (issue 9): when a worker frees up, the waiting job of the
highest priority starts next, whether its doorbell came from the submit or from the
sweeper's ring-again, on PostgreSQL + RabbitMQ (a classic priority queue) and on the
embedded default (SQLite + the filesystem transport, which orders its files by priority).

Job IDs are chosen so that the low-priority jobs sort first by ID and were submitted
first: without priorities, both brokers and the sweeper would send them first."""

from __future__ import annotations

import pytest
from kombu import Connection, Queue

import jobs
from jobs._core.states import State
from jobs._doorbell.queues import HIGH_BAND_SUFFIX
from jobs._worker.broker_errors import UPGRADE_HINT
from tests.acceptance.conftest import (
    BOTH,
    PG_RABBITMQ,
    Stack,
    rabbit_queue_depth,
    wait_until,
)

LOW, HIGH = 0, 9
PER_PRIORITY = 10


def start_order(stack: Stack, job_ids: list[str]) -> list[str]:
    """The jobs in the order a worker first claimed them (the database clock's instants)."""
    first_claim = {job_id: stack.claims(job_id)[0].at for job_id in job_ids}
    return sorted(job_ids, key=lambda job_id: first_claim[job_id])


def submit_low_then_high(stack: Stack) -> tuple[list[str], list[str]]:
    low = [
        stack.submit(
            "check_order", {"order_id": n, "check_seconds": 0.05}, job_id=f"a-low-{n}", priority=LOW
        )
        for n in range(PER_PRIORITY)
    ]
    high = [
        stack.submit(
            "check_order",
            {"order_id": n, "check_seconds": 0.05},
            job_id=f"b-high-{n}",
            priority=HIGH,
        )
        for n in range(PER_PRIORITY)
    ]
    return low, high


def assert_high_started_first(stack: Stack, low: list[str], high: list[str]) -> None:
    for job_id in low + high:
        assert stack.wait_state(job_id, timeout=120).state is State.COMPLETED
    order = start_order(stack, low + high)
    print(f"\n[priorities] start order: {' '.join(order)}")
    # Every high-priority job started before every low-priority one; one low job may have
    # been handed to the worker before the high ones were queued (a prefetched message).
    lows_before_last_high = sum(1 for job_id in order[: order.index(high[-1])] if job_id in low)
    assert lows_before_last_high <= 1, order
    assert set(order[:PER_PRIORITY]) <= set(high) | {order[0]}, order


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_higher_priority_jobs_start_first_when_a_worker_frees_up(stack: Stack) -> None:
    """One worker of concurrency 1 busy with a blocker; 10 low then 10 high are submitted
    while it runs; once it frees up, the high ones start first."""
    stack.worker("w1", concurrency=1)
    blocker = stack.submit("check_order", {"order_id": 0, "check_seconds": 3.0}, job_id="blocker")
    stack.wait_effect(blocker, "check_payment:start", timeout=60)
    low, high = submit_low_then_high(stack)
    assert stack.job(low[0]).state is State.QUEUED  # the worker is still busy
    assert_high_started_first(stack, low, high)


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_the_sweepers_ring_again_rings_higher_priorities_first(stack: Stack) -> None:
    """The submits' doorbells are lost (none sent); the sweeper re-sends all 20 in one pass,
    the high-priority batch first and each message with its priority; one worker of
    concurrency 1 then starts the high ones first."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=1)
    jobs.set_doorbell(None)  # as if every publish after commit was lost
    low, high = submit_low_then_high(stack)
    assert stack.queue_depth() == (0, 0)
    submitted = {job_id: stack.job(job_id).dispatched_at for job_id in low + high}
    stack.sweeper()
    # Every job rung by the sweeper (over one pass or more: each counts as lost one second
    # after its own submit) before a worker starts.
    wait_until(
        lambda: all(stack.job(job_id).dispatched_at != at for job_id, at in submitted.items()),
        60,
        "the sweeper's doorbells for all 20 jobs",
    )
    stack.worker("w1", concurrency=1)
    assert_high_started_first(stack, low, high)


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_quorum_queues_keep_priority_with_a_high_band(stack: Stack) -> None:
    """A quorum queue (RabbitMQ 3.x) has no message priorities, so priorities 5 to 9 ring
    through a second quorum queue, the high band, consumed beside the normal one: 5 high
    jobs submitted behind 20 low ones do not wait for the low backlog. A worker holds one
    doorbell per band, so the bands take turns (a single FIFO queue would start them last)."""
    stack.configure(JOBS_QUEUE_TYPE="quorum")
    high_band = stack.queue + HIGH_BAND_SUFFIX
    stack.worker("w1", concurrency=1)
    blocker = stack.submit("check_order", {"order_id": 0, "check_seconds": 3.0}, job_id="blocker")
    stack.wait_effect(blocker, "check_payment:start", timeout=60)
    low = [
        stack.submit("check_order", {"order_id": n, "check_seconds": 0.05}, job_id=f"a-{n:02}")
        for n in range(20)
    ]
    high = [
        stack.submit(
            "check_order",
            {"order_id": n, "check_seconds": 0.05},
            job_id=f"b-{n}",
            priority=HIGH,
        )
        for n in range(5)
    ]
    assert rabbit_queue_depth(high_band) is not None  # the band is a queue of its own
    for job_id in low + high:
        assert stack.wait_state(job_id, timeout=120).state is State.COMPLETED
    order = start_order(stack, low + high)
    print(f"\n[quorum bands] high jobs started at {[order.index(h) + 1 for h in high]} of 25")
    # The bands take turns, roughly (measured: high jobs 1st, 4th, 7th, 9th, 11th); one FIFO
    # queue would start them 21st to 25th.
    assert order.index(high[-1]) < 3 * len(high), order


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_queue_declared_before_priorities_says_how_to_upgrade(stack: Stack) -> None:
    """An older version declared the classic queue without ``x-max-priority``: RabbitMQ
    refuses this version's declare. The worker stays up and says what to do in its line;
    once the operator deleted the old queue, it consumes, and the sweeper rings the job
    whose doorbell was refused."""
    url = stack.env["JOBS_BROKER_URL"]
    with Connection(url) as conn:  # the old deployment's queue, no priorities
        Queue(stack.queue, exchange=stack.queue, routing_key=stack.queue, durable=True).bind(
            conn.default_channel
        ).declare()
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=2)
    worker = stack.worker("A", wait=False)
    stack.sweeper()
    job_id = stack.submit("check_order", {"order_id": 1, "check_seconds": 0.1}, priority=HIGH)
    refused = wait_until(
        lambda: [line for line in worker.output().splitlines() if "broker refused queue" in line],
        60,
        "a refused declare",
    )
    assert "inequivalent arg 'x-max-priority'" in refused[0], refused[0]
    assert UPGRADE_HINT.strip() in refused[0], refused[0]
    assert worker.alive()
    assert stack.job(job_id).state is State.QUEUED
    with Connection(url) as conn:  # the documented upgrade step
        conn.default_channel.queue_delete(stack.queue)
    assert stack.wait_state(job_id, timeout=60).state is State.COMPLETED
    assert worker.alive()
