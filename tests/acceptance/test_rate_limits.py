"""Global rate limits with real workers (issue 27 part 2): ``rate_limit="5/s"`` holds across
two worker daemons on PostgreSQL and RabbitMQ, every job completes, and the jobs the rate
holds back are not claimed and dropped in a loop (each delivery waits for its start, or
is held and rung by a start); ``rate_limit_per_key="2/s"`` holds for each key apart while
the keys run side by side.

``sleep_steps`` jobs of one short step; the starts are read from each job's history (its
``claimed`` transition, on the database's clock)."""

from __future__ import annotations

import time

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack
from tests.acceptance.start_checks import most_in_window, starts_of

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq]

KIND = "sleep_steps"


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_five_a_second_over_two_workers_never_starts_more_than_eleven_in_two_seconds(
    stack: Stack,
) -> None:
    """40 jobs submitted at once, ``rate_limit="5/s"``, 2 prefork workers of concurrency 4
    and no sweeper: all complete, no 2 s window holds more than 11 starts (10 at the rate,
    plus the window's two ends), the drain takes about 40 / 5 = 8 s, and the deliveries
    the rate turned away number at most two per job (no loop)."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60)
    stack.store.submissions.set_limits(KIND, max_running=None, max_queued=None, rate_limit="5/s")
    workers = [stack.worker(name, pool="prefork", concurrency=4, wait=False) for name in "AB"]
    for worker in workers:
        worker.wait_ready()
    started = time.monotonic()
    job_ids = [stack.submit(KIND, {"steps": 1, "seconds": 0.05}) for _ in range(40)]
    try:
        finished = [stack.wait_state(job_id, timeout=90) for job_id in job_ids]
    except AssertionError:
        for worker in workers:
            print(worker.output()[-20000:])
        raise
    elapsed = time.monotonic() - started
    assert all(job.state is State.COMPLETED for job in finished), finished
    starts = starts_of(stack, job_ids)
    assert len(starts) == 40
    most = most_in_window(starts, 2.0)
    assert most <= 11, most
    span = (starts[-1] - starts[0]).total_seconds()
    assert 39 * 0.2 * 0.5 <= span <= 39 * 0.2 * 1.5, span
    output = "".join(worker.output() for worker in workers)
    turned_away = output.count("held by its rate limit") + output.count("for the next start")
    assert turned_away <= 2 * len(job_ids), turned_away
    print(
        f"\n[rate limit 5/s] 40 jobs on 2x4 prefork in {elapsed:.2f}s, starts over "
        f"{span:.2f}s ({39 / span:.2f}/s), at most {most} in 2 s; "
        f"{turned_away} deliveries turned away by the rate"
    )


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_two_a_second_per_key_holds_for_each_of_three_keys_over_two_workers(
    stack: Stack,
) -> None:
    """30 jobs over 3 keys (``submit(..., concurrency_key=…)``, interleaved), submitted at
    once, ``rate_limit_per_key="2/s"``, 2 prefork workers of concurrency 4: every job
    completes and ran its step once; no key starts more than 5 in any 2 s (4 at its rate,
    plus the window's two ends); each key's 10 starts span about 9 / 2 = 4.5 s, and the
    keys run side by side (the whole drain spans about as long as one key's)."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60)
    stack.store.submissions.set_limits(
        KIND, max_running=None, max_queued=None, rate_limit_per_key="2/s"
    )
    workers = [stack.worker(name, pool="prefork", concurrency=4, wait=False) for name in "AB"]
    for worker in workers:
        worker.wait_ready()
    keys = ["tenant-a", "tenant-b", "tenant-c"]
    keyed: dict[str, list[str]] = {key: [] for key in keys}
    for _ in range(10):
        for key in keys:
            keyed[key].append(
                stack.submit(KIND, {"steps": 1, "seconds": 0.05}, concurrency_key=key)
            )
    every = [job_id for job_ids in keyed.values() for job_id in job_ids]
    try:
        finished = [stack.wait_state(job_id, timeout=90) for job_id in every]
    except AssertionError:
        for worker in workers:
            print(worker.output()[-20000:])
        raise
    assert all(job.state is State.COMPLETED for job in finished), finished
    stack.assert_ran_once(every)
    figures = []
    for key, job_ids in keyed.items():
        starts = starts_of(stack, job_ids)
        assert len(starts) == 10, (key, starts)
        most = most_in_window(starts, 2.0)
        assert most <= 5, (key, most)
        span = (starts[-1] - starts[0]).total_seconds()
        assert 9 * 0.5 * 0.5 <= span <= 9 * 0.5 * 1.5, (key, span)
        figures.append(f"{key}: {9 / span:.2f}/s, at most {most} in 2 s")
    every_start = starts_of(stack, every)
    whole = (every_start[-1] - every_start[0]).total_seconds()
    assert whole <= 9 * 0.5 * 1.5, whole
    print(f"\n[rate limit 2/s per key] 30 jobs over 3 keys in {whole:.2f}s; " + "; ".join(figures))
