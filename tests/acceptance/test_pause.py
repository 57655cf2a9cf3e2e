"""Pause and resume with real workers: ``jobctl pause`` holds a kind (or a queue) on every
worker at once, nothing of it is claimed, lost or failed, and ``jobctl resume`` rings the
held jobs so they run at once.

Real prefork workers on PostgreSQL and RabbitMQ (and the embedded SQLite set-up for the
kind's pause). The first test runs no sweeper and sets the lost-message rule to a minute:
only the resume's own doorbells can make the held jobs run within seconds. The second runs
a sweeper whose ring-again is a second: over several of its passes the paused jobs are
neither rung again (each delivery was dropped once) nor counted as lost messages.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import BOTH, PG_RABBITMQ, Stack, dropped_deliveries, wait_until
from tests.conftest import jobctl_in_child

pytestmark = [pytest.mark.acceptance]

JOBS = 6
HELD_SECONDS = 4.0


def jobctl(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """``jobctl <args>`` in a child process on the stack's settings; it must succeed."""
    done = jobctl_in_child(stack.env, *args)
    assert done.returncode == 0, done.stderr
    return done


def dropped_lines(stack: Stack, job_ids: list[str]) -> list[str]:
    """The workers' log lines of deliveries dropped because a pause held the job."""
    workers = [proc for proc in stack.procs if proc.name.startswith("worker-")]
    return [
        line
        for line in dropped_deliveries(workers, "held:")
        if any(job_id in line for job_id in job_ids)
    ]


def assert_held(stack: Stack, job_ids: list[str]) -> None:
    """Every job is QUEUED, never claimed, no step of it ran."""
    for job_id in job_ids:
        job = stack.job(job_id)
        assert job.state is State.QUEUED, job
        assert job.attempts == 0, job
        assert [move.to_state for move in stack.history(job_id)] == [State.QUEUED]
        assert stack.effects(job_id) == []


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_a_paused_kind_waits_on_every_worker_and_runs_at_once_on_resume(stack: Stack) -> None:
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=60)
    if stack.amqp:
        workers = [stack.worker(name, pool="prefork", concurrency=2, wait=False) for name in "AB"]
        for worker in workers:
            worker.wait_ready()
    else:
        stack.worker("A")
    paused = jobctl(stack, "pause", "sleep_steps", "--by", "tester", "--reason", "acceptance")
    assert "kind 'sleep_steps' paused since" in paused.stdout

    held = [stack.submit("sleep_steps", {"steps": 1, "seconds": 0.05}) for _ in range(JOBS)]
    other = stack.submit("check_order", {"order_id": 1, "check_seconds": 0.05})
    # Another kind runs meanwhile: the workers are up and claiming.
    assert stack.wait_state(other, timeout=30).state is State.COMPLETED
    # Every held job's doorbell arrived and was dropped, saying why.
    lines = wait_until(
        lambda: (found := dropped_lines(stack, held)) and len(found) >= JOBS and found,
        30,
        "every held job's delivery to be dropped",
    )
    assert all("kind 'sleep_steps' paused since" in line and "by tester" in line for line in lines)
    time.sleep(HELD_SECONDS)
    assert_held(stack, held)
    if stack.rabbitmq:
        stack.wait_queue_empty()  # dropped cleanly: acknowledged, nothing redelivered
    explained = jobctl(stack, "explain", held[0])
    assert "paused since" in explained.stdout
    assert "by tester" in explained.stdout

    started = time.monotonic()
    resumed = jobctl(stack, "resume", "sleep_steps")
    assert f"rang {JOBS} waiting jobs" in resumed.stdout
    finished = [stack.wait_state(job_id, timeout=30) for job_id in held]
    took = time.monotonic() - started
    assert all(job.state is State.COMPLETED for job in finished), finished
    assert took < 20, f"held jobs took {took:.1f}s after the resume"  # not the 60 s ring-again
    stack.assert_ran_once(held)
    print(f"\n[pause] {JOBS} held jobs completed {took:.2f}s after the resume")


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_paused_queue_holds_every_kind_on_it_and_the_sweeper_leaves_it_alone(
    stack: Stack,
) -> None:
    stack.configure(JOBS_RING_AGAIN_AFTER_SECONDS=1)
    worker = stack.worker("A", pool="prefork", concurrency=2)
    sweeper = stack.sweeper()
    jobctl(stack, "pause", "--queue", stack.queue, "--by", "tester")

    held = [stack.submit("sleep_steps", {"steps": 1, "seconds": 0.05}) for _ in range(JOBS)]
    held.append(stack.submit("check_order", {"order_id": 2, "check_seconds": 0.05}))
    held.append(stack.submit("sleep_steps", {"steps": 1, "seconds": 0.05}, queue=stack.queue))
    wait_until(
        lambda: len(dropped_lines(stack, held)) >= len(held),
        30,
        "every held job's delivery to be dropped",
    )
    # Several sweeper passes and ring-again periods go by.
    time.sleep(HELD_SECONDS)
    assert_held(stack, held)
    assert len(dropped_lines(stack, held)) == len(held), "a paused job was rung again"
    counters = stack.store.depth.counters()
    assert not any(name == "recovery_lost_message" for name, _kind in counters), counters
    assert sweeper.alive(), sweeper.output()[-3000:]
    assert "Traceback" not in sweeper.output(), sweeper.output()[-3000:]
    stack.wait_queue_empty()
    listing = jobctl(stack, "limits")
    assert "PAUSED QUEUE" in listing.stdout
    assert stack.queue in listing.stdout

    started = time.monotonic()
    resumed = jobctl(stack, "resume", "--queue", stack.queue)
    assert f"rang {len(held)} waiting jobs" in resumed.stdout
    finished = [stack.wait_state(job_id, timeout=30) for job_id in held]
    took = time.monotonic() - started
    assert all(job.state is State.COMPLETED for job in finished), finished
    assert took < 20, took
    stack.assert_ran_once([job_id for job_id in held if stack.job(job_id).kind == "sleep_steps"])
    assert worker.alive()
