"""Concurrency keys with real workers (issue 27 part 1): ``max_running_per_key`` holds across
worker daemons, a finishing run hands its key's slot to the next job of that key, and a
worker SIGKILLed while it holds a slot gives it up through the sweeper's recovery.

``sleep_steps`` jobs (steps of a few tenths of a second) keyed per tenant with
``submit(..., concurrency_key=…)``, the kind limited to 2 RUNNING per key, on prefork
workers over PostgreSQL and RabbitMQ. "At most 2 at once" is checked from each job's
history, on the database's clock: every run is the interval from its claim to the move
that ended it (a dead owner's run ends at the sweeper's recovery of it).
"""

from __future__ import annotations

import datetime as dt
import itertools
import signal
import time
from collections import defaultdict
from typing import Any

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, dropped_deliveries, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.postgres, pytest.mark.rabbitmq]

KIND = "sleep_steps"
PER_KEY = 2


def _runs(stack: Stack, job_id: str) -> list[tuple[dt.datetime, dt.datetime]]:
    """(claimed at, left RUNNING at) of each run of the job, from its history."""
    history = stack.history(job_id)
    assert history[-1].to_state is not State.RUNNING, history
    return [
        (move.at, after.at)
        for move, after in itertools.pairwise(history)
        if move.to_state is State.RUNNING
    ]


def _most_at_once(runs: list[tuple[dt.datetime, dt.datetime]]) -> int:
    """The most runs RUNNING at one instant (a run that ends as another starts is not two)."""
    edges = sorted([(end, -1) for _, end in runs] + [(start, 1) for start, _ in runs])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def _assert_per_key(
    stack: Stack, keyed: dict[str, list[str]], limit: int = PER_KEY
) -> dict[str, int]:
    """Every job COMPLETED once, and no key ever had more than ``limit`` RUNNING."""
    most = {}
    for key, job_ids in keyed.items():
        runs = []
        for job_id in job_ids:
            history = stack.history(job_id)
            assert [t.to_state for t in history].count(State.COMPLETED) == 1, history
            runs += _runs(stack, job_id)
        most[key] = _most_at_once(runs)
        assert most[key] <= limit, (key, sorted(runs))
    return most


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_three_keys_on_two_workers_never_run_more_than_two_of_a_key(stack: Stack) -> None:
    """3 keys x 10 jobs, max_running_per_key=2, 2 prefork workers of concurrency 4: all
    complete, each step ran once, never more than 2 RUNNING of a key; deliveries that found
    their key full were dropped and said which key, and the freed slots rang the rest
    (no sweeper runs, and the lost-message rule waits a minute)."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60)
    stack.store.submissions.set_limits(
        KIND, max_running=None, max_queued=None, max_running_per_key=PER_KEY
    )
    workers = [stack.worker(name, pool="prefork", concurrency=4, wait=False) for name in "AB"]
    for worker in workers:
        worker.wait_ready()
    keyed: dict[str, list[str]] = defaultdict(list)
    started = time.monotonic()
    for n in range(30):
        key = f"tenant-{n % 3}"
        keyed[key].append(stack.submit(KIND, {"steps": 2, "seconds": 0.2}, concurrency_key=key))
    finished = [stack.wait_state(job_id, timeout=90) for ids in keyed.values() for job_id in ids]
    elapsed = time.monotonic() - started
    assert all(job.state is State.COMPLETED for job in finished), finished
    for job in finished:
        assert stack.effect_count(job.id, "sleep-0") == 1
        assert stack.effect_count(job.id, "sleep-1") == 1
    most = _assert_per_key(stack, keyed)
    assert most == dict.fromkeys(keyed, PER_KEY), most  # the limit was reached, not just kept
    dropped = dropped_deliveries(workers, "waiting for a slot of key")
    assert dropped, "no delivery found its key full"
    print(
        f"\n[concurrency keys] 30 jobs over 3 keys (2 per key) on 2x4 prefork in "
        f"{elapsed:.2f}s; {len(dropped)} deliveries found their key full"
    )


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_sigkilled_worker_holding_a_keys_slot_gives_it_up_through_the_sweeper(
    stack: Stack,
) -> None:
    """A solo worker runs the first job of a key limited to 1 and is SIGKILLed mid-step.
    Before that, a second worker's deliveries of the other jobs of the key were dropped (the
    slot was held), and it stopped, so no worker takes the dead run's redelivered message
    over: the sweeper sees the dead owner's liveness lock gone and re-queues the job, which
    frees the slot. A new worker then runs the jobs one at a time (each finishing run rings
    the next of the key), and each job completes exactly once."""
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60, JOBS_LEASE_SECONDS=60)
    stack.store.submissions.set_limits(
        KIND, max_running=None, max_queued=None, max_running_per_key=1
    )
    victim = stack.worker("A", pool="solo")
    first = stack.submit(KIND, {"steps": 3, "seconds": 1.5}, concurrency_key="cust-42")
    wait_until(lambda: stack.effect_count(first, "sleep-0") == 1, 30, "the first step to start")
    assert victim.owns(stack.job(first).owner)
    rest = [
        stack.submit(KIND, {"steps": 1, "seconds": 0.1}, concurrency_key="cust-42")
        for _ in range(2)
    ]
    bystander = stack.worker("B", pool="prefork", concurrency=2)
    wait_until(
        lambda: bystander.output().count("waiting for a slot of key 'cust-42'") >= 2,
        30,
        "the bystander's deliveries to find the key full",
    )
    assert all(stack.job(job_id).state is State.QUEUED for job_id in rest)
    bystander.terminate()
    bystander.popen.wait(20)
    steps_at_kill = stack.steps(first)
    victim.kill(signal.SIGKILL)
    victim.popen.wait(10)
    stack.sweeper()

    def recovered() -> list[Any]:
        return [t for t in stack.history(first) if t.from_state is State.RUNNING]

    [recovery] = wait_until(recovered, 30, "the sweeper to recover the dead run")
    assert recovery.to_state is State.QUEUED, stack.history(first)
    assert "liveness lock released" in (recovery.reason or ""), recovery
    survivor = stack.worker("C", pool="prefork", concurrency=2)
    finished = [stack.wait_state(job_id, timeout=90) for job_id in [first, *rest]]
    assert all(job.state is State.COMPLETED for job in finished), finished
    assert all(survivor.owns(job.owner) for job in finished), finished
    # The steps recorded before the kill ran once; only the step in flight ran again.
    recorded_at_kill = {step.name for step in steps_at_kill}
    counts = {name: stack.effect_count(first, name) for name in ("sleep-0", "sleep-1", "sleep-2")}
    assert all(counts[name] == 1 for name in recorded_at_kill), counts
    assert sorted(counts.values()) in ([1, 1, 1], [1, 1, 2]), counts
    _assert_per_key(stack, {"cust-42": [first, *rest]}, 1)
