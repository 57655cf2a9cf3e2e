"""A warm shutdown (SIGTERM to the worker's main process) hands running jobs back at their
next step instead of running on: the worker exits within a step, the job goes back to
QUEUED with its attempt given back, and another worker finishes it without re-running a
recorded step."""

from __future__ import annotations

import signal
import time

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    BOTH,
    PG_RABBITMQ,
    Stack,
    assert_recorded_steps_ran_once,
    wait_until,
)

pytestmark = pytest.mark.acceptance


@pytest.mark.parametrize("pool", ["solo", "prefork"])
@pytest.mark.parametrize("stack", BOTH, indirect=True)
def test_warm_shutdown_hands_the_job_back(stack: Stack, pool: str) -> None:
    first = stack.worker("A", pool=pool)
    job_id = stack.submit("sleep_steps", {"steps": 30, "seconds": 0.5})
    wait_until(lambda: len(stack.steps(job_id)) >= 2, 30, "worker A to record two steps")
    stopped_at = first.kill(signal.SIGTERM)
    first.popen.wait(20)
    stopped_in = time.time() - stopped_at
    # 30 steps of 0.5 s: running on would take ~14 s more; handing back takes one step.
    assert stopped_in < 5, f"worker took {stopped_in:.1f}s to stop"
    job = stack.job(job_id)
    assert job.state is State.QUEUED, job
    assert job.attempts == 0  # a hand-back gives its attempt back
    hand_back = stack.history(job_id)[-1]
    assert hand_back.from_state is State.RUNNING
    assert "shutting down" in (hand_back.reason or ""), hand_back
    recorded_by_a = len(stack.steps(job_id))
    assert 2 <= recorded_by_a < 30

    stack.worker("B", pool=pool)
    if not stack.rabbitmq:
        stack.sweeper()  # the embedded transport may have lost A's re-published doorbell
    job = stack.wait_state(job_id, timeout=60)
    assert job.state is State.COMPLETED, job
    assert len(stack.steps(job_id)) == 30
    assert_recorded_steps_ran_once(stack, job_id)
    print(
        f"\n[{stack.backend}/{pool}] worker stopped {stopped_in:.2f}s after SIGTERM, "
        f"having recorded {recorded_by_a} of 30 steps"
    )


@pytest.mark.parametrize("stack", [PG_RABBITMQ], indirect=True)
def test_warm_shutdown_sends_the_completion_a_pool_process_holds(stack: Stack) -> None:
    """Issue 19: a pool process holding its last job's completion (for a next claim that
    never comes) sends it as it stops, rather than leave the job to be recovered and its
    last step run again."""
    stack.configure(JOBS_HOLD_COMPLETION_SECONDS=60)
    worker = stack.worker("A", pool="prefork", concurrency=1)
    # Two jobs before it make the pool process busy (two claims in a row came within half
    # the window after a completion), so the next job's completion is held; an idle
    # process writes it at once.
    for order_id in (40, 41):
        warm_up = stack.submit("check_order", {"order_id": order_id, "check_seconds": 0.0})
        assert stack.wait_state(warm_up, timeout=60).state is State.COMPLETED
    job_id = stack.submit("check_order", {"order_id": 42, "check_seconds": 0.1})
    stack.wait_effect(job_id, "check_payment:done")
    time.sleep(0.5)
    assert stack.job(job_id).state is State.RUNNING  # held
    worker.kill(signal.SIGTERM)
    worker.popen.wait(30)
    job = stack.job(job_id)
    assert job.state is State.COMPLETED, job
    assert stack.effect_count(job_id, "check_payment:done") == 1
