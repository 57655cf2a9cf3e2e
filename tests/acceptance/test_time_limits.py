"""Time limits on a real worker: a step stuck past its ``timeout`` (in ``time.sleep``, a C
call no exception interrupts, and in a busy loop) does not hold its job. The pool child's
heartbeat stops renewing the lease, writes the retry (or, on the last attempt, the
failure) with the reason, and ends the child, as Celery's hard time limit would; the pool
starts a new child and the worker serves other jobs meanwhile.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from jobs._core.states import State
from tests.acceptance.conftest import PG_RABBITMQ, Stack, wait_until

pytestmark = pytest.mark.acceptance

ENDED = "ending pool process"


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_step_past_its_timeout_is_retried_then_failed_and_its_child_ended(
    stack: Stack,
) -> None:
    worker = stack.worker("A", pool="prefork", concurrency=2)
    stack.sweeper()
    children_before = set(worker.pool_children())
    assert len(children_before) == 2

    started = time.monotonic()
    sleeping = stack.submit("hang", {"how": "sleep", "timeout": 2})
    busy = stack.submit("hang", {"how": "busy", "timeout": 2})
    ordinary = stack.submit("check_order", {"order_id": 1, "check_seconds": 0.2})

    reason = "step 'hang' passed its timeout of 2 s"
    for job_id in (sleeping, busy):
        # Two attempts of 2 s each, a backoff of 1 s, a redelivery: far inside two leases
        # (3 s) plus two timeouts each, with room for a loaded machine.
        job = stack.wait_state(job_id, timeout=90)
        elapsed = time.monotonic() - started
        print(f"{job_id} FAILED {elapsed:.1f} s after submit")
        assert job.state is State.FAILED
        assert job.attempts == 2
        assert job.last_error == reason
        history = stack.history(job_id)
        retry = [t for t in history if t.to_state is State.QUEUED and t.reason != "submitted"]
        # Retried by the owner at the deadline, not by the sweeper after the lease ran out.
        assert [t.reason for t in retry] == [f"retry: {reason}"]
        assert retry[0].owner is not None
        assert worker.owns(retry[0].owner)
        assert history[-1].to_state is State.FAILED
        assert history[-1].reason == reason
        assert stack.steps(job_id) == []
        # Each attempt ran in a pool child that was ended: none of them finished the step,
        # and none is alive now.
        runs = stack.effects(job_id)
        assert [effect for effect, _pid in runs] == ["hang:start", "hang:start"]
        pids = {pid for _effect, pid in runs}
        assert len(pids) == 2
        # The child writes the outcome, then exits: the exit may come a moment later.
        wait_until(
            lambda pids=pids: not any(psutil.pid_exists(pid) for pid in pids),
            30,
            "the timed-out pool children to exit",
        )

    assert stack.wait_state(ordinary).state is State.COMPLETED
    # The worker stayed up, its pool is whole again (new children), and it serves jobs.
    assert worker.alive()
    wait_until(lambda: len(worker.pool_children()) == 2, 30, "the pool to replace its children")
    assert not set(worker.pool_children()) & children_before
    assert worker.output().count(ENDED) == 4
    after = stack.submit("check_order", {"order_id": 2, "check_seconds": 0.2})
    assert stack.wait_state(after).state is State.COMPLETED

    # What an operator reads: the reason is in `jobctl show`.
    shown = subprocess.run(
        [sys.executable, "-m", "jobs", "show", sleeping],
        capture_output=True,
        text=True,
        env=stack.env,
        check=True,
    ).stdout
    assert reason in shown


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_job_past_its_run_timeout_fails_with_the_reason(stack: Stack) -> None:
    worker = stack.worker("A", pool="prefork", concurrency=1)
    job_id = stack.submit("hang_run", {})
    job = stack.wait_state(job_id, timeout=60)
    assert job.state is State.FAILED
    assert job.last_error == "the job passed its timeout of 2 s"
    assert worker.output().count(ENDED) == 1
    assert worker.alive()
    follow_up = stack.submit("check_order", {"order_id": 3, "check_seconds": 0.1})
    assert stack.wait_state(follow_up).state is State.COMPLETED


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_a_step_holding_the_gil_past_its_timeout_is_ended_by_the_backstop(
    stack: Stack,
) -> None:
    """A runaway regular expression holds the GIL: the child's heartbeat thread never runs,
    so it can neither renew the lease nor write the time-out. The lease runs out and the
    sweeper retries the job; the kernel's timer, armed one lease past the step's deadline,
    ends the stuck child with SIGALRM, and the pool replaces it."""
    worker = stack.worker("A", pool="prefork", concurrency=2)
    stack.sweeper()
    job_id = stack.submit("hang", {"how": "regex", "timeout": 2})
    job = stack.wait_state(job_id, timeout=90)
    assert job.state is State.FAILED
    assert job.last_error == "lease expired; attempts exhausted"
    runs = stack.effects(job_id)
    assert [effect for effect, _pid in runs] == ["hang:start", "hang:start"]
    pids = {pid for _effect, pid in runs}
    assert len(pids) == 2
    wait_until(
        lambda: not any(psutil.pid_exists(pid) for pid in pids),
        30,
        "the stuck children to be ended",
    )
    wait_until(
        lambda: worker.output().count("exited with 'signal 14") == 2,
        30,
        "Celery to see both children ended by SIGALRM",
    )
    assert worker.alive()
    wait_until(lambda: len(worker.pool_children()) == 2, 30, "the pool to replace its children")
    after = stack.submit("check_order", {"order_id": 4, "check_seconds": 0.1})
    assert stack.wait_state(after).state is State.COMPLETED
