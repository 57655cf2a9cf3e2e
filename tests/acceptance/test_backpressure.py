"""Backpressure with real workers: ``max_running`` holds across worker daemons, and a finished
job hands its slot to the next waiting one at once.

Two prefork workers (four pool processes) on PostgreSQL and RabbitMQ, ``sleep_steps``
limited to one RUNNING job, four jobs submitted together. Every doorbell is delivered at
once; the deliveries that find the slot taken are dropped ("waiting for a slot"), and only
the slot hand-off of the finishing run (``delivery._pass_on_slot``) can ring the next
job before the sweeper's lost-message rule would, which is set to a minute here and has no
sweeper to run it.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, dropped_deliveries

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq]

RING_AGAIN_AFTER = 60
JOBS = 4
STEPS = 2
SECONDS = 0.5


def _running_intervals(stack: Stack, job_id: str) -> list[tuple[dt.datetime, dt.datetime]]:
    """(claimed at, left RUNNING at) for each run of the job, from its history."""
    history = stack.history(job_id)
    intervals = []
    for move, after in itertools.pairwise(history):
        if move.to_state is State.RUNNING:
            intervals.append((move.at, after.at))
    assert history[-1].to_state is not State.RUNNING, history
    return intervals


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_max_running_one_runs_jobs_one_at_a_time_and_hands_off_the_slot(stack: Stack) -> None:
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=RING_AGAIN_AFTER)
    stack.store.submissions.set_limits("sleep_steps", max_running=1, max_queued=None)
    workers = [stack.worker(name, pool="prefork", concurrency=2, wait=False) for name in "AB"]
    for worker in workers:
        worker.wait_ready()

    job_ids = [
        stack.submit("sleep_steps", {"steps": STEPS, "seconds": SECONDS}) for _ in range(JOBS)
    ]
    finished = [stack.wait_state(job_id, timeout=40) for job_id in job_ids]
    assert all(job.state is State.COMPLETED for job in finished), finished

    # Each job was claimed once and ran once: the refused deliveries wrote nothing.
    stack.assert_ran_once(job_ids, steps=("sleep-0", "sleep-1"))

    # At most one RUNNING at any instant, by the database's clock.
    intervals = sorted(i for job_id in job_ids for i in _running_intervals(stack, job_id))
    assert len(intervals) == JOBS
    for (_, ended), (started, _) in itertools.pairwise(intervals):
        assert started >= ended, f"two RUNNING at once: {intervals}"

    # The slot was handed on at once, not after the sweeper's one-minute ring-again.
    gaps = [
        (started - ended).total_seconds()
        for (_, ended), (started, _) in itertools.pairwise(intervals)
    ]
    total = (
        max(job.finished_at for job in finished if job.finished_at)
        - min(job.created_at for job in finished)
    ).total_seconds()
    print(
        f"\n[backpressure] {JOBS} jobs one at a time in {total:.2f}s; "
        f"hand-off gaps {[round(g, 3) for g in gaps]}s"
    )
    assert max(gaps) < 5, gaps
    assert total < RING_AGAIN_AFTER / 2, total

    # The deliveries that found the slot taken were dropped and said why.
    waiting = dropped_deliveries(workers, "waiting for a slot")
    assert waiting, "no delivery was refused for a slot"
    assert all("'sleep_steps' allows 1 RUNNING at once" in line for line in waiting), waiting
    assert all(any(job_id in line for job_id in job_ids) for line in waiting), waiting
