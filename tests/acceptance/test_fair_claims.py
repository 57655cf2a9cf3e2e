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
from tests.acceptance.start_checks import claims_after, most_in_window, starts_of

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
    after = claims_after(stack, [*early, *late], submitted)
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


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_fair_kind_under_a_rate_limit_serves_a_late_tenant_within_the_bound(
    stack: Stack,
) -> None:
    """The kind also ``rate_limit="10/s"``: a tenant's 150 jobs queued, another tenant's 20
    submitted once 10 ran; every job completes and ran once, no 2 s window holds more
    than 21 starts (the rate's bound), and the late tenant's jobs are served within the
    fair bound, counted in claims (the rate spaces the claims; it does not reorder them)."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60)
    stack.store.submissions.set_limits(KIND, max_running=None, max_queued=None, rate_limit="10/s")
    workers = [
        stack.worker(name, pool="prefork", concurrency=CONCURRENCY, wait=False) for name in "AB"
    ]
    for worker in workers:
        worker.wait_ready()
    early = [stack.submit(KIND, {"tenant": "big"}) for _ in range(150)]
    wait_until(
        lambda: sum(stack.job(job_id).state is State.COMPLETED for job_id in early[:20]) >= 10,
        60,
        "the big tenant's first jobs to run",
    )
    late = [stack.submit(KIND, {"tenant": "small"}) for _ in range(20)]
    submitted = stack.history(late[0])[0].at
    every = [*early, *late]
    try:
        finished = [stack.wait_state(job_id, timeout=90) for job_id in every]
    except AssertionError:
        for worker in workers:
            print(worker.output()[-20000:])
        raise
    assert all(job.state is State.COMPLETED for job in finished), finished
    stack.assert_ran_once(every)
    most = most_in_window(starts_of(stack, every), 2.0)
    assert most <= 21, most
    after = claims_after(stack, every, submitted)
    positions = sorted(after.index(job_id) + 1 for job_id in late)
    big_left = sum(1 for job_id in after if job_id in set(early))
    assert big_left > 100, big_left  # the big tenant still had a backlog when they came
    assert positions[0] <= SLOTS + 1, positions
    assert positions[-1] <= 2 * len(late) + 2 * SLOTS, positions
    print(
        f"\n[fairness under rate 10/s] late tenant's {len(late)} jobs behind {big_left} of the big "
        f"tenant's: claim positions after their submission {positions} (bound: first <= "
        f"{SLOTS + 1}); at most {most} starts in 2 s"
    )
