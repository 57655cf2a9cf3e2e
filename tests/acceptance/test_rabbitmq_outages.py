"""RabbitMQ misbehaves under running jobs (scenarios 8 and 9).

Each test has a one-node RabbitMQ of its own (``PRIVATE_PG_PRIVATE_RABBITMQ``: a real
``rabbitmq-server`` on ports of its own), so it may stop the broker's app and change its
consumer timeout while the rest of the suite runs on the shared node beside it; the node
is destroyed after the test, whatever the test did to it.
"""

from __future__ import annotations

import re
import time

import pytest

from jobs._core.states import State
from tests.acceptance.conftest import (
    PRIVATE_PG_PRIVATE_RABBITMQ,
    Stack,
    assert_recorded_steps_ran_once,
    owner_pid,
    wait_for_amqp,
    wait_until,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def broker_ctl(stack: Stack, *args: str) -> str:
    """``rabbitmqctl`` against the test's own node."""
    assert stack.cluster is not None
    return stack.cluster.ctl(stack.cluster.nodes[0], *args)


def recorded(stack: Stack, job_id: str) -> int:
    return len(stack.steps(job_id))


@pytest.mark.parametrize("stack", [PRIVATE_PG_PRIVATE_RABBITMQ], indirect=True)
def test_rabbitmq_restart_during_run(stack: Stack) -> None:
    """Scenario 8: ``rabbitmqctl stop_app``/``start_app`` while one job runs on a prefork
    worker and one on a solo worker, one is submitted while the broker is down and one
    after it is back: all complete, and no recorded step runs again."""
    prefork = stack.worker("P", pool="prefork", wait=False)
    solo = stack.worker("S", pool="solo", wait=False)
    stack.sweeper()
    prefork.wait_ready()
    solo.wait_ready()
    running = [stack.submit("sleep_steps", {"steps": 8, "seconds": 1.0}) for _ in range(2)]
    wait_until(
        lambda: all(recorded(stack, j) >= 2 for j in running), 30, "both jobs to be two steps in"
    )
    owners = {stack.job(j).owner for j in running}
    assert any(prefork.owns(o) for o in owners), owners
    assert any(solo.owns(o) for o in owners), owners
    on_prefork = next(j for j in running if prefork.owns(stack.job(j).owner))
    old_run = stack.job(on_prefork)

    outage_started = time.monotonic()
    outage_started_at = time.time()
    try:
        broker_ctl(stack, "stop_app")
        during = stack.submit("sleep_steps", {"steps": 3, "seconds": 0.5})
        job = stack.job(during)
        # The publish failed and said so; the job is committed and waits for the sweeper.
        assert job.state is State.QUEUED, job
        assert job.dispatched_at is None, job
        time.sleep(2)  # keep the broker down a little while the jobs run on
    finally:
        broker_ctl(stack, "start_app")
        wait_for_amqp(stack.env["JOBS_BROKER_URL"], 60)
    outage = time.monotonic() - outage_started
    after = stack.submit("sleep_steps", {"steps": 3, "seconds": 0.5})

    all_jobs = [*running, during, after]
    finished = time.monotonic()
    for job_id in all_jobs:
        job = stack.wait_state(job_id, timeout=90)
        assert job.state is State.COMPLETED, job
    print(
        f"\n[rabbitmq restart] outage {outage:.1f}s; all {len(all_jobs)} jobs completed "
        f"{time.monotonic() - finished:.1f}s after the broker was back"
    )
    for job_id in all_jobs:
        runs = assert_recorded_steps_ran_once(stack, job_id)
        rerun = {step: n for step, n in runs.items() if n > 1}
        moves = [
            (t.from_state and t.from_state.value, t.to_state.value, t.reason)
            for t in stack.history(job_id)
        ]
        print(f"  {job_id[:8]}: steps re-run after a lost owner: {rerun or 'none'}; {moves}")
        assert len(stack.steps(job_id)) == stack.job(job_id).inputs["steps"]
    assert prefork.alive()
    assert solo.alive()

    # The old run stopped: the prefork worker's run in progress when its connection was lost
    # was cancelled (worker_cancel_long_running_tasks_on_connection_loss), not left to race
    # the redelivery. Its pool child started no step once the loss was seen (allowing the
    # step in flight, 1 s, and a loaded machine), though 6 steps of 1 s were left, and the
    # job finished under a newer claim by another process.
    old_pid = owner_pid(old_run.owner)
    cutoff = outage_started_at + 3.0
    late = [
        (effect, round(at - outage_started_at, 2))
        for effect, pid, at in stack.timed_effects(on_prefork)
        if pid == old_pid and at > cutoff
    ]
    assert not late, f"the old run on pid {old_pid} went on after the connection loss: {late}"
    finished_under = stack.claims(on_prefork)[-1]
    assert finished_under.fence is not None
    assert finished_under.fence > old_run.fence
    assert finished_under.owner != old_run.owner
    later_steps = [step for step in stack.steps(on_prefork) if step.fence != old_run.fence]
    assert later_steps
    assert all(step.owner != old_run.owner for step in later_steps)
    stack.wait_queue_empty(timeout=30)


@pytest.fixture
def short_consumer_timeout(stack: Stack) -> int:
    """The test's node's consumer_timeout at 5 s, for channels opened from now on."""
    broker_ctl(stack, "eval", "application:set_env(rabbit, consumer_timeout, 5000).")
    assert broker_ctl(stack, "eval", "application:get_env(rabbit, consumer_timeout).").strip() == (
        "{ok,5000}"
    )
    return 5


@pytest.mark.parametrize("stack", [PRIVATE_PG_PRIVATE_RABBITMQ], indirect=True)
def test_long_job_hands_back_before_consumer_timeout(
    stack: Stack, short_consumer_timeout: int
) -> None:
    """Scenario 9: a 72 s job under a 5 s consumer_timeout. With a 2 s delivery budget
    the worker hands the job back at step boundaries, so no delivery stays unacked long
    enough for RabbitMQ to close the channel (it checks about once a minute)."""
    steps, seconds = 36, 2.0
    stack.configure(JOBS_DELIVERY_BUDGET_SECONDS=2)
    worker = stack.worker("A", pool="prefork", concurrency=1)  # channel opened after set_env
    job_id = stack.submit("sleep_steps", {"steps": steps, "seconds": seconds})
    job = stack.wait_state(job_id, timeout=steps * seconds + 60)
    assert job.state is State.COMPLETED, job
    assert job.result == {"steps": steps}

    history = stack.history(job_id)
    claims = [t for t in history if t.to_state is State.RUNNING]
    handed_back = [
        t for t in history if t.from_state is State.RUNNING and t.to_state is State.QUEUED
    ]
    assert all("delivery time budget used up" in (t.reason or "") for t in handed_back)
    assert len(handed_back) >= steps - 1, len(handed_back)
    deliveries = [
        (history[i + 1].at - move.at).total_seconds()
        for i, move in enumerate(history)
        if move.to_state is State.RUNNING
    ]
    ran_for = (history[-1].at - claims[0].at).total_seconds()
    print(
        f"\n[consumer_timeout {short_consumer_timeout}s] job ran {ran_for:.0f}s in "
        f"{len(claims)} deliveries, longest {max(deliveries):.2f}s; "
        f"attempts counted: {job.attempts}"
    )
    assert ran_for > 65, "RabbitMQ checks consumer timeouts about once a minute"
    assert max(deliveries) < short_consumer_timeout
    assert job.attempts == 1  # a hand-back is not a failed attempt

    assert assert_recorded_steps_ran_once(stack, job_id) == {f"sleep-{n}": 1 for n in range(steps)}
    log = worker.output()
    assert worker.alive()
    assert "PRECONDITION_FAILED" not in log, log[-5000:]
    assert "Connection to broker lost" not in log, log[-5000:]
    assert log.count(f"job {job_id}: handed_back") == len(handed_back)
    stack.wait_queue_empty(timeout=30)


@pytest.mark.parametrize("stack", [PRIVATE_PG_PRIVATE_RABBITMQ], indirect=True)
def test_without_the_hand_back_rabbitmq_closes_the_channel(
    stack: Stack, short_consumer_timeout: int
) -> None:
    """Negative control for the test above: the same long job, with a delivery budget
    longer than the job (so it is never handed back), keeps its delivery unacknowledged
    past consumer_timeout, and RabbitMQ closes the worker's channel. The test above passes
    because of the hand-back, not because the short timeout never fires."""
    steps, seconds = 36, 2.0
    stack.configure(JOBS_DELIVERY_BUDGET_SECONDS=600)
    worker = stack.worker("A", pool="prefork", concurrency=1)  # channel opened after set_env
    job_id = stack.submit("sleep_steps", {"steps": steps, "seconds": seconds})
    started = time.monotonic()
    closed = wait_until(
        lambda: re.search(r"^.*PRECONDITION_FAILED.*$", worker.output(), re.MULTILINE),
        steps * seconds + 30,
        "RabbitMQ to close the channel of the unacknowledged delivery",
        interval=0.5,
    )
    print(
        f"\n[consumer_timeout {short_consumer_timeout}s, no hand-back] channel closed "
        f"{time.monotonic() - started:.0f}s after submit: {closed.group(0)[-200:]}"
    )
    assert "acknowledgement" in closed.group(0) or "timed out" in closed.group(0), closed
    # It ran as one delivery up to then: nothing was handed back.
    assert not [
        t
        for t in stack.history(job_id)
        if t.from_state is State.RUNNING and t.to_state is State.QUEUED
    ]
