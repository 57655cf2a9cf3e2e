"""Priorities with real workers (issue 9): when a worker frees up, the waiting job of the
highest priority starts next, whether its doorbell came from the submit or from the
sweeper's re-dispatch, on PostgreSQL + RabbitMQ (a classic priority queue) and on the
embedded default (SQLite + the filesystem transport, which orders its files by priority).

Job IDs are chosen so that the low-priority jobs sort first by ID and were submitted
first: without priorities, both brokers and the sweeper would send them first."""

from __future__ import annotations

import pytest

from jobs import api
from jobs.core.states import State
from tests.acceptance.conftest import BOTH, Stack, wait_until

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
def test_the_sweepers_redispatch_rings_higher_priorities_first(stack: Stack) -> None:
    """The submits' doorbells are lost (none sent); the sweeper re-sends all 20 in one pass,
    the high-priority batch first and each message with its priority; one worker of
    concurrency 1 then starts the high ones first."""
    stack.configure(JOBS_REDISPATCH_AFTER_SECONDS=1)
    api.set_dispatcher(None)  # as if every publish after commit was lost
    low, high = submit_low_then_high(stack)
    assert stack.queue_depth() == (0, 0)
    stack.sweeper()
    wait_until(lambda: stack.queue_depth()[0] >= 2 * PER_PRIORITY, 60, "the sweeper's doorbells")
    stack.worker("w1", concurrency=1)
    assert_high_started_first(stack, low, high)
