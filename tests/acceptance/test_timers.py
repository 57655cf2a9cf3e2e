"""Durable timers across a worker restart, with two sweepers.

A ``follow_up`` job records ``lookup_order``, then ``ctx.sleep("cool_off", …)``: it goes
back to QUEUED due at the timer, holding no worker, lease or message. While it sleeps the
worker that ran it is SIGKILLed and a new one starts, and a stray early doorbell reaches
the new worker (it must be dropped: the job is not due). Two sweepers run; the wake-up is
their dispatch of the due job. The job must wake once, within a sweep interval (plus a
delivery) of its timer, and must not run ``lookup_order`` again. A job submitted with
``run_at`` at the same instant starts on time the same way.
"""

from __future__ import annotations

import datetime as dt

import pytest

import jobs
from jobs._core.interrupts import wake_at_of
from jobs._core.states import State
from tests.acceptance.conftest import BOTH, Stack, assert_recorded_steps_ran_once, wait_until

SWEEP_INTERVAL = 1.0
SLEEP_SECONDS = 20.0
# A claim's delivery after the sweeper's send: a publish, a consume and a claim on a loaded
# two-core machine. The wake-up may be late by one sweep interval plus this, never early.
DELIVERY_SLACK = 2.0


@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_a_job_sleeping_across_a_worker_restart_wakes_once_on_time(stack: Stack) -> None:
    stack.configure(JOBS_SWEEP_INTERVAL_SECONDS=SWEEP_INTERVAL)
    first = stack.worker("A")
    sweepers = [stack.start(f"sweeper-{n}", ["sweeper"]) for n in (1, 2)]
    job_id = stack.submit("follow_up", {"order_id": 7, "wait_seconds": SLEEP_SECONDS})
    run_at = stack.store.reads.now() + dt.timedelta(seconds=SLEEP_SECONDS)
    delayed = stack.submit("check_order", {"order_id": 8, "check_seconds": 0}, run_at=run_at)

    def asleep() -> dt.datetime | None:
        job = stack.job(job_id)
        timers = [wake_at_of(step.output) for step in stack.steps(job_id)]
        wake = next((instant for instant in timers if instant is not None), None)
        return wake if job.state is State.QUEUED and wake is not None else None

    wake_at = wait_until(asleep, 60, f"job {job_id} to sleep")
    sleeping = stack.job(job_id)
    assert sleeping.run_after == wake_at
    assert (sleeping.owner, sleeping.lease_until, sleeping.dispatched_at) == (None, None, None)
    assert sleeping.attempts == 0, "a sleep is not a failed attempt"

    first.kill()  # SIGKILL while the job sleeps: it holds nothing of the job
    first.popen.wait(10)
    second = stack.worker("B")
    assert stack.queue_depth() == (0, 0), "a sleeping or delayed job holds no message"
    assert stack.job(delayed).dispatched_at is None
    assert stack.store.reads.now() < wake_at - dt.timedelta(seconds=3), (
        "the restart took most of the sleep; raise SLEEP_SECONDS"
    )

    jobs.ring(job_id)  # a stray doorbell before the wake-up: dropped, not held
    wait_until(
        lambda: f"job {job_id}: delivery dropped, QUEUED but not due" in second.output(),
        30,
        "the early doorbell to be dropped",
    )
    assert stack.job(job_id).state is State.QUEUED
    assert stack.effect_count(job_id, "send_reminder") == 0

    done = stack.wait_state(job_id, timeout=SLEEP_SECONDS + 60)

    assert done.state is State.COMPLETED, done.last_error
    assert second.owns(done.owner)
    history = stack.history(job_id)
    sleeps = [move for move in history if (move.reason or "").startswith("sleep until")]
    assert len(sleeps) == 1
    claims = stack.claims(job_id)
    assert len(claims) == 2, "claimed once before the sleep and once at the wake-up"
    late = (claims[1].at - wake_at).total_seconds()
    print(f"wake-up claimed {late:.3f}s after the timer (sweep interval {SWEEP_INTERVAL}s)")
    assert 0 <= late <= SWEEP_INTERVAL + DELIVERY_SLACK
    assert stack.effect_count(job_id, "lookup_order") == 1
    assert stack.effect_count(job_id, "send_reminder") == 1
    assert assert_recorded_steps_ran_once(stack, job_id) == {
        "lookup_order": 1,
        "send_reminder": 1,
    }
    assert {step.name for step in stack.steps(job_id)} == {
        "lookup_order",
        "cool_off",
        "send_reminder",
    }

    started = stack.wait_state(delayed, timeout=60)
    assert started.state is State.COMPLETED, started.last_error
    [claim] = stack.claims(delayed)
    late = (claim.at - run_at).total_seconds()
    print(f"run_at job claimed {late:.3f}s after its instant")
    assert 0 <= late <= SWEEP_INTERVAL + DELIVERY_SLACK
    assert all(sweeper.alive() for sweeper in sweepers)
