"""Fairness across keys with real workers (issue 27 part 3): a tenant with 500 queued jobs of
a ``fair=True`` kind does not delay a later tenant's 10 beyond the bound, on PostgreSQL and
RabbitMQ with 2 prefork workers; every job completes once.

The bound (docs/guides/backpressure.md#fairness-across-keys): a key never served is picked
by the next claim, so the late tenant's first job starts within ``W + 1`` claims of its
submission (``W``: the worker slots, whose picks may have been read before it was
committed), and its ``n``-th within about ``2n + W`` with two keys taking turns. The claim
positions are read from the history (the claims, on the database's clock)."""

from __future__ import annotations

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq]

KIND = "fair_steps"
WORKERS, CONCURRENCY = 2, 2
SLOTS = WORKERS * CONCURRENCY


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_tenants_500_queued_jobs_do_not_delay_a_late_tenants_10(stack: Stack) -> None:
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60)
    workers = [
        stack.worker(name, pool="prefork", concurrency=CONCURRENCY, wait=False) for name in "AB"
    ]
    for worker in workers:
        worker.wait_ready()
    early = [stack.submit(KIND, {"tenant": "big"}) for _ in range(500)]
    wait_until(
        lambda: sum(stack.job(job_id).state is State.COMPLETED for job_id in early[:30]) >= 20,
        60,
        "the big tenant's first jobs to run",
    )
    late = [stack.submit(KIND, {"tenant": "small"}) for _ in range(10)]
    submitted = stack.history(late[0])[0].at
    try:
        finished = [stack.wait_state(job_id, timeout=120) for job_id in [*early, *late]]
    except AssertionError:
        left = [stack.job(job_id) for job_id in [*early, *late]]
        left = [job for job in left if job.state is not State.COMPLETED]
        print("LEFT", [(job.id, job.state, job.dispatched_at, job.concurrency_key) for job in left])
        out = "".join(worker.output() for worker in workers)
        print("DROPPED", [line for line in out.splitlines() if "delivery dropped" in line][:20])
        for job in left:
            print("OF", job.id, [line for line in out.splitlines() if job.id in line])
        print("ERRORS", [line for line in out.splitlines() if "rror" in line][:20])
        raise
    assert all(job.state is State.COMPLETED for job in finished)
    for job_id in [*early, *late]:
        assert stack.effect_count(job_id, "sleep-0") == 1
    claims = sorted(
        (move.at, job_id)
        for job_id in [*early, *late]
        for move in stack.history(job_id)
        if move.to_state is State.RUNNING
    )
    after = [job_id for at, job_id in claims if at >= submitted]
    positions = [after.index(job_id) + 1 for job_id in late]
    big_left = sum(1 for job_id in after if job_id in set(early))
    assert big_left > 100, big_left  # the big tenant still had a backlog when they came
    assert min(positions) <= SLOTS + 1, positions
    assert max(positions) <= 2 * len(late) + 2 * SLOTS, positions
    print(
        f"\n[fairness] late tenant's 10 jobs behind a backlog of {big_left} of the big "
        f"tenant's: claim positions after their submission {sorted(positions)} "
        f"(bound: first <= {SLOTS + 1})"
    )
